package tollgate

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// What the cost models' units are made of.
const (
	// FDBPageBytes is FoundationDB's page: its costs are whole pages of this many bytes.
	FDBPageBytes = 4096
	// CouchbaseReadUnitBytes and CouchbaseWriteUnitBytes are Couchbase's read and write units.
	CouchbaseReadUnitBytes  = 4096
	CouchbaseWriteUnitBytes = 1024
)

var ruDefaults = map[string]float64{
	"read_base": 0.125, "read_per_batch": 0.5, "read_per_byte": 1.0 / 65536, "read_per_cpu_ms": 1.0 / 3,
	"write_base": 1, "write_per_batch": 1, "write_per_byte": 1.0 / 1024, "batch_proportion": 0.7,
}

var linearKeys = []string{"read_base", "read_per_byte", "write_base", "write_per_byte", "per_cpu_ms"}

// Usage is what one operation did, or is expected to do.
type Usage struct {
	// Write says it is a write; else a read.
	Write bool
	// Bytes read (a read) or written (a write).
	Bytes uint64
	// CPUms is the CPU time spent serving it, in milliseconds (the ru model charges it on
	// reads).
	CPUms float64
	// Replicas a write goes to (ru multiplies by it); 0 is taken as 1.
	Replicas uint32
	// Durable is a durable write (couchbase charges it twice).
	Durable bool
	// Units, when set, are units the caller priced itself: every model takes them as they
	// are.
	Units *float64
}

// CostModel prices what requests did in units: Count (the default), FDB, RU, Couchbase or
// Linear, by the same formulas as the Rust and Python clients.
type CostModel struct {
	// Name is count, fdb, ru, couchbase or linear, as a settings file names it.
	Name string
	// Coefficients are the model's (fungibility for fdb; TiDB's for ru; the user's for linear).
	Coefficients map[string]float64
}

// Count prices one unit per request, or the units given.
func Count() CostModel { return CostModel{Name: "count"} }

// Couchbase prices Couchbase's read units (4 KiB) and write units (1 KiB, twice when durable).
func Couchbase() CostModel { return CostModel{Name: "couchbase"} }

// FDB prices FoundationDB's way: bytes rounded up to whole 4 KiB pages; a write costs
// fungibility reads of the same size (4 in FoundationDB).
func FDB(fungibility float64) (CostModel, error) {
	if err := checkCost(fungibility, "fungibility"); err != nil {
		return CostModel{}, err
	}
	if fungibility == 0 {
		return CostModel{}, &ErrInvalidArgument{"fungibility", "must be above 0"}
	}
	return CostModel{Name: "fdb", Coefficients: map[string]float64{"fungibility": fungibility}}, nil
}

// RU prices TiDB's request units: any of its coefficients may be given, the rest are TiDB's.
func RU(coefficients map[string]float64) (CostModel, error) {
	return withCoefficients("ru", ruDefaults, coefficients)
}

// Linear prices base + bytes × per_byte + cpu_ms × per_cpu_ms per kind, with the user's
// coefficients (read_base, read_per_byte, write_base, write_per_byte, per_cpu_ms; 0 unless
// given).
func Linear(coefficients map[string]float64) (CostModel, error) {
	zero := map[string]float64{}
	for _, k := range linearKeys {
		zero[k] = 0
	}
	return withCoefficients("linear", zero, coefficients)
}

func withCoefficients(name string, defaults, given map[string]float64) (CostModel, error) {
	c := map[string]float64{}
	for k, v := range defaults {
		c[k] = v
	}
	for k, v := range given {
		if _, ok := defaults[k]; !ok {
			keys := make([]string, 0, len(defaults))
			for d := range defaults {
				keys = append(keys, d)
			}
			sort.Strings(keys)
			return CostModel{}, &ErrInvalidArgument{k, "unknown coefficient; expected one of " + strings.Join(keys, ", ")}
		}
		if err := checkCost(v, k); err != nil {
			return CostModel{}, err
		}
		c[k] = v
	}
	return CostModel{Name: name, Coefficients: c}, nil
}

func ceilDiv(a, b uint64) float64 { return float64((a + b - 1) / b) }

// Cost is the full cost of what u did.
func (m CostModel) Cost(u Usage) (float64, error) {
	if u.Units != nil {
		return *u.Units, checkCost(*u.Units, "units")
	}
	if err := checkCost(u.CPUms, "cpu_ms"); err != nil {
		return 0, err
	}
	c, b := m.Coefficients, u.Bytes
	replicas := float64(u.Replicas)
	if replicas < 1 {
		replicas = 1
	}
	var units float64
	switch m.Name {
	case "", "count":
		units = 1
	case "fdb":
		pages := math.Max(ceilDiv(b, FDBPageBytes), 1) * FDBPageBytes
		units = pages
		if u.Write {
			// FoundationDB keeps costs as integers: the product is truncated.
			units = math.Trunc(c["fungibility"] * pages)
		}
	case "ru":
		if u.Write {
			units = (c["write_base"] + c["write_per_batch"]*c["batch_proportion"] + float64(b)*c["write_per_byte"]) * replicas
		} else {
			units = c["read_base"] + c["read_per_batch"]*c["batch_proportion"] + float64(b)*c["read_per_byte"] + u.CPUms*c["read_per_cpu_ms"]
		}
	case "couchbase":
		if u.Write {
			units = ceilDiv(b, CouchbaseWriteUnitBytes)
			if u.Durable {
				units *= 2
			}
		} else {
			units = ceilDiv(b, CouchbaseReadUnitBytes)
		}
	case "linear":
		base, perByte := c["read_base"], c["read_per_byte"]
		if u.Write {
			base, perByte = c["write_base"], c["write_per_byte"]
		}
		units = base + float64(b)*perByte + u.CPUms*c["per_cpu_ms"]
	default:
		return 0, &ErrInvalidArgument{"cost_model", fmt.Sprintf("must be count, fdb, ru, couchbase or linear, got %q", m.Name)}
	}
	return units, checkCost(units, "cost")
}

// Upfront is the part of the cost known before the operation runs, what admission charges:
// a write in full; a read, what a read of nothing costs (Couchbase's at least 1).
func (m CostModel) Upfront(u Usage) (float64, error) {
	if u.Units != nil || u.Write {
		return m.Cost(u)
	}
	u.Bytes, u.CPUms = 0, 0
	units, err := m.Cost(u)
	if m.Name == "couchbase" {
		units = math.Max(units, 1)
	}
	return units, err
}

// consumption is one request that did u, priced by m, in TiDB's detail.
func (m CostModel) consumption(u Usage) (Consumption, error) {
	units, err := m.Cost(u)
	if err != nil {
		return Consumption{}, err
	}
	if u.Write {
		return Consumption{WRU: units, WriteBytes: float64(u.Bytes), CPUms: u.CPUms, WriteRPCs: 1}, nil
	}
	return Consumption{RRU: units, ReadBytes: float64(u.Bytes), CPUms: u.CPUms, ReadRPCs: 1}, nil
}
