// Package tollgate is Tollgate's client for Go programs. This file holds the demand
// definition every Tollgate client reports by (the Rust model's demand module); a table of
// cases the Rust code computes (clients/python/tests/shared_cases.json) keeps the Rust,
// Python and Go clients in step.
package tollgate

import "math"

const (
	// DemandFolding is the folding time of the demand smoother, in seconds.
	DemandFolding = 0.2
	// HungryFactor is how much more than its grant a group whose requests waited asks for.
	HungryFactor = 1.5
	// CostFactorFolding is the folding time of the settled-to-asked cost factor, in seconds.
	CostFactorFolding = 2.0
	// MinInterval is the shortest interval a rate is measured over, in seconds.
	MinInterval = 0.1
)

// The bounds of the settled-to-asked cost factor.
const costFactorLow, costFactorHigh = 1.0 / 64.0, 64.0

// Consumption is TiDB's detailed consumption: read and write request units, bytes, CPU and
// requests.
type Consumption struct {
	RRU, WRU, ReadBytes, WriteBytes, CPUms, ReadRPCs, WriteRPCs float64
}

// Since is what was added since earlier, never negative.
func (c Consumption) Since(earlier Consumption) Consumption {
	d := func(a, b float64) float64 { return math.Max(a-b, 0) }
	return Consumption{
		d(c.RRU, earlier.RRU), d(c.WRU, earlier.WRU), d(c.ReadBytes, earlier.ReadBytes),
		d(c.WriteBytes, earlier.WriteBytes), d(c.CPUms, earlier.CPUms),
		d(c.ReadRPCs, earlier.ReadRPCs), d(c.WriteRPCs, earlier.WriteRPCs),
	}
}

// plus is c with other added in.
func (c Consumption) plus(other Consumption) Consumption {
	return Consumption{
		c.RRU + other.RRU, c.WRU + other.WRU, c.ReadBytes + other.ReadBytes,
		c.WriteBytes + other.WriteBytes, c.CPUms + other.CPUms,
		c.ReadRPCs + other.ReadRPCs, c.WriteRPCs + other.WriteRPCs,
	}
}

// Counts are a group's running totals.
type Counts struct {
	Asked, Consumed, Unthrottled float64
	// AdmittedUnits are the units admitted as asked, before settlements.
	AdmittedUnits               float64
	Admitted, Throttled, Waited uint64
	// WouldRefuse counts requests admitted in shadow mode that would have been refused.
	WouldRefuse uint64
	Detail      Consumption
}

// Report is one group's report, what an exchange carries for it.
type Report struct {
	Demand, Unthrottled, Waiting, Consumed   float64
	Requests, Throttled, Waited, WouldRefuse uint64
	// Held is the rate of the grant held (0: none, or unlimited).
	Held   float64
	Detail Consumption
}

// DemandMeter turns a group's running totals into reports.
type DemandMeter struct {
	last       Counts
	lastAt     float64
	average    float64
	costFactor float64
	lastMoved  float64 // when the totals last moved
}

// NewDemandMeter is a meter whose first report measures from now (seconds on any clock).
func NewDemandMeter(now float64) *DemandMeter {
	return &DemandMeter{lastAt: now, costFactor: 1, lastMoved: now}
}

// Report is the report for what happened since the last one, given the totals now, the
// units waiting now and the rate held (granted: false when unlimited or not granted yet).
//
// Demand is the rate of units asked since the last report, or its moving average when that
// is higher, scaled by the units settled per unit admitted as asked (a moving average); a
// group whose requests had to wait asks for at least half again the rate it holds.
func (m *DemandMeter) Report(now float64, counts Counts, waiting, held float64, granted bool) Report {
	dt := math.Max(now-m.lastAt, MinInterval)
	last := m.last
	rate := math.Max((counts.Asked-last.Asked)/dt, 0)
	keep := math.Exp(-dt / DemandFolding)
	m.average = m.average*keep + rate*(1-keep)
	if admitted := counts.AdmittedUnits - last.AdmittedUnits; admitted > 0 {
		factor := math.Min(math.Max((counts.Consumed-last.Consumed)/admitted, costFactorLow), costFactorHigh)
		fold := math.Exp(-dt / CostFactorFolding)
		m.costFactor = m.costFactor*fold + factor*(1-fold)
	}
	demand := math.Max(rate, m.average) * m.costFactor
	if counts.Waited > last.Waited && granted && !math.IsInf(held, 0) {
		demand = math.Max(demand, held*HungryFactor)
	}
	since := func(a, b uint64) uint64 {
		if a > b {
			return a - b
		}
		return 0
	}
	if !granted {
		held = 0
	}
	r := Report{
		Demand:      demand,
		Unthrottled: math.Max(counts.Unthrottled-last.Unthrottled, 0) / dt,
		Waiting:     math.Max(waiting, 0),
		Consumed:    math.Max(counts.Consumed-last.Consumed, 0),
		Requests:    since(counts.Admitted, last.Admitted),
		Throttled:   since(counts.Throttled, last.Throttled),
		Held:        math.Max(held, 0),
		Waited:      since(counts.Waited, last.Waited),
		WouldRefuse: since(counts.WouldRefuse, last.WouldRefuse),
		Detail:      counts.Detail.Since(last.Detail),
	}
	if m.moved(counts) {
		m.lastMoved = now
	}
	m.last, m.lastAt = counts, now
	return r
}

// moved says whether the totals moved since the last report.
func (m *DemandMeter) moved(counts Counts) bool {
	return counts.Asked != m.last.Asked || counts.Consumed != m.last.Consumed
}

// Idle says whether nothing was seen for at least expiry seconds: such a group is no longer
// reported, and takes a fresh grant before it admits again.
func (m *DemandMeter) Idle(now float64, counts Counts, expiry float64) bool {
	return !m.moved(counts) && now-m.lastMoved >= expiry
}
