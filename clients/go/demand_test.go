package tollgate_test

// The demand definition replayed from the table the Rust code computes
// (clients/python/tests/shared_cases.json, checked current by crates/core/tests/it/shared_cases.rs):
// the Go client reports what the Rust and Python clients report.

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
)

type detail struct {
	RRU        float64 `json:"rru"`
	WRU        float64 `json:"wru"`
	ReadBytes  float64 `json:"read_bytes"`
	WriteBytes float64 `json:"write_bytes"`
	CPUms      float64 `json:"cpu_ms"`
	ReadRPCs   float64 `json:"read_rpcs"`
	WriteRPCs  float64 `json:"write_rpcs"`
}

func (d detail) consumption() tollgate.Consumption {
	return tollgate.Consumption{RRU: d.RRU, WRU: d.WRU, ReadBytes: d.ReadBytes, WriteBytes: d.WriteBytes,
		CPUms: d.CPUms, ReadRPCs: d.ReadRPCs, WriteRPCs: d.WriteRPCs}
}

type step struct {
	At     float64 `json:"at_s"`
	Counts struct {
		Asked         float64 `json:"asked"`
		Consumed      float64 `json:"consumed"`
		AdmittedUnits float64 `json:"admitted_units"`
		Unthrottled   float64 `json:"unthrottled"`
		Admitted      uint64  `json:"admitted"`
		Throttled     uint64  `json:"throttled"`
		Waited        uint64  `json:"waited"`
		Detail        detail  `json:"detail"`
	} `json:"counts"`
	Waiting float64  `json:"waiting"`
	Granted *float64 `json:"granted"`
	Report  struct {
		Demand      float64 `json:"demand"`
		Unthrottled float64 `json:"unthrottled"`
		Waiting     float64 `json:"waiting"`
		Consumed    float64 `json:"consumed"`
		Requests    float64 `json:"requests"`
		Throttled   float64 `json:"throttled"`
		Held        float64 `json:"held"`
		Waited      float64 `json:"waited"`
		Detail      detail  `json:"detail"`
	} `json:"report"`
}

func close(a, b float64) bool {
	return math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b)) || math.Abs(a-b) <= 1e-12
}

func TestDemandIsReportedAsTheRustClientReportsIt(t *testing.T) {
	text, err := os.ReadFile("../python/tests/shared_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Demand [][]step `json:"demand"`
	}
	if err := json.Unmarshal(text, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Demand) == 0 {
		t.Fatal("no demand cases in the table")
	}
	for s, steps := range table.Demand {
		meter := tollgate.NewDemandMeter(0)
		for i, st := range steps {
			c := st.Counts
			counts := tollgate.Counts{Asked: c.Asked, Consumed: c.Consumed, AdmittedUnits: c.AdmittedUnits,
				Unthrottled: c.Unthrottled, Admitted: c.Admitted, Throttled: c.Throttled, Waited: c.Waited,
				Detail: c.Detail.consumption()}
			held, granted := 0.0, st.Granted != nil
			if granted {
				held = *st.Granted
			}
			got := meter.Report(st.At, counts, st.Waiting, held, granted)
			want := st.Report
			pairs := map[string][2]float64{
				"demand": {got.Demand, want.Demand}, "unthrottled": {got.Unthrottled, want.Unthrottled},
				"waiting": {got.Waiting, want.Waiting}, "consumed": {got.Consumed, want.Consumed},
				"requests": {float64(got.Requests), want.Requests}, "throttled": {float64(got.Throttled), want.Throttled},
				"held": {got.Held, want.Held}, "waited": {float64(got.Waited), want.Waited},
				"detail.rru": {got.Detail.RRU, want.Detail.RRU}, "detail.wru": {got.Detail.WRU, want.Detail.WRU},
				"detail.read_rpcs":  {got.Detail.ReadRPCs, want.Detail.ReadRPCs},
				"detail.write_rpcs": {got.Detail.WriteRPCs, want.Detail.WriteRPCs},
				"detail.cpu_ms":     {got.Detail.CPUms, want.Detail.CPUms},
			}
			for key, p := range pairs {
				if !close(p[0], p[1]) {
					t.Errorf("case %d, step %d, %s: %v, the Rust client reports %v", s, i, key, p[0], p[1])
				}
			}
		}
	}
}
