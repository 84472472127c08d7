package tollgate

import (
	"math"
	"sync"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// group is one group's bucket, its grant and its running totals, as the Rust and Python
// clients keep them. Times are seconds on the limiter's clock.
type group struct {
	mu   sync.Mutex
	name string
	// Whether a grant came, whether one with a rate came yet, the largest cost asked before
	// it, and what the bucket starts holding then: full when this process is the group's only
	// client, else one such request (the group's burst is banked by the others).
	granted, started  bool
	firstCost, start  float64
	unlimited, shadow bool
	rate, burst       float64
	tokens, stamp     float64
	reserved, last    float64
	clients           float64
	counts            Counts
	// largest is the cost of the largest request admitted since the last exchange took it.
	largest float64
	waiting float64
	meter   *DemandMeter
	// A debt: units owed beyond the bank, paid back at repayRate over repayS seconds (0: at
	// once, blocking); and whether dropped work counts as consumed.
	owed, repayRate, repayS float64
	countDropped            bool
	criticalReserve         float64
	// Requests admitted and refused by class (critical, sheddable), in all and as last
	// reported.
	classes, classesReported [2][2]uint64
	// The in-flight quota's share (-1: no quota), the slots held, the most held or tried at
	// once since the last exchange, and the tries refused a slot since.
	slots, held, asked, short int
	// What this client holds of the group's quotas per window.
	allot allotment
}

// inFlightRetry is the retry-after of a request refused an in-flight slot: a slot comes back
// when a request finishes, which no clock foretells.
const inFlightRetry = 0.005

// maxInFlight bounds the slots a report asks for.
const maxInFlight = 1000000

// repayShareMax is the most of a repay period's refill a debt may stand at; past it, the rest
// is taken from the bank at once.
const repayShareMax = 0.5

func newGroup(name string, now float64) *group {
	return &group{name: name, start: math.Inf(1), stamp: now, clients: 1, meter: NewDemandMeter(now), slots: -1}
}

func (g *group) refill(now float64) {
	if now > g.stamp {
		gain := (now - g.stamp) * g.rate
		if g.owed > 0 {
			pay := math.Min(g.owed, (now-g.stamp)*g.repayRate)
			g.owed -= pay
			gain -= pay
		}
		g.tokens = math.Min(g.burst, g.tokens+gain)
		g.stamp = now
	}
}

// charge takes units more than were admitted: what the bank covers at once, the rest as a
// debt paid back over the group's repay period (at once, blocking, without one).
func (g *group) charge(units, now float64) {
	if !g.granted || g.unlimited {
		return
	}
	g.refill(now)
	if g.repayS <= 0 || g.rate <= 0 {
		g.tokens -= units
		return
	}
	covered := math.Min(units, math.Max(g.tokens, 0))
	g.tokens -= covered
	g.owed += units - covered
	if limit := g.repayS * g.rate * repayShareMax; g.owed > limit {
		g.tokens -= g.owed - limit
		g.owed = limit
	}
	g.repayRate = g.owed / g.repayS
}

// refund gives units back to the bank.
func (g *group) refund(units, now float64) {
	if g.granted && !g.unlimited {
		g.refill(now)
		g.tokens = math.Min(g.burst, g.tokens+units)
	}
}

// take takes cost at now: 0 and true when admitted, else the seconds until it could be. open
// and closed are safe mode's policies; a refusal is counted unless count is false (a request
// that waits counts once, however many times it tries).
func (g *group) take(cost, now float64, class Class, open, closed, waited, count bool) (wait float64, ok, slot bool) {
	// An in-flight slot first: cheap to give back if the bucket then refuses.
	if g.slots >= 0 && !open {
		if g.held+1 > g.asked {
			g.asked = g.held + 1
		}
		if g.held >= g.slots {
			g.short++
			if g.shadow {
				g.admitShadow(cost)
				return 0, true, false
			}
			if count {
				g.refused(cost)
				g.countClass(class, false)
			}
			return inFlightRetry, false, false
		}
		g.held++
		slot = true
	}
	// Then the allotment of the group's quotas: a count per window, never overrun.
	if !open {
		if wait := g.allot.take(cost, now); wait > 0 {
			if g.shadow {
				g.admitShadow(cost)
				return 0, true, slot
			}
			if slot {
				g.held--
			}
			if count {
				g.refused(cost)
				g.countClass(class, false)
			}
			return wait, false, false
		}
	}
	wait, ok = g.takeAny(cost, now, class.floor(g.criticalReserve), open, closed, waited, count)
	if !ok {
		g.allot.giveBack(cost)
	}
	if !ok && slot {
		g.held--
		slot = false
	}
	if ok || count {
		g.countClass(class, ok)
	}
	return wait, ok, slot
}

// countClass counts a critical or sheddable request admitted or refused.
func (g *group) countClass(class Class, admitted bool) {
	if class == Normal {
		return
	}
	i, j := 0, 0
	if class == Sheddable {
		i = 1
	}
	if !admitted {
		j = 1
	}
	g.classes[i][j]++
}

func (g *group) takeAny(cost, now, floor float64, open, closed, waited, count bool) (float64, bool) {
	if open || (g.granted && g.unlimited && !closed) {
		g.admit(cost, waited)
		return 0, true
	}
	var wait float64
	switch {
	case !g.granted:
		wait = 0.05
	case closed:
		wait = 1
	default:
		g.refill(now)
		keep := floor * g.burst
		if cost <= g.tokens-keep {
			g.tokens -= cost
			g.admit(cost, waited)
			return 0, true
		}
		if g.rate <= 0 || cost+keep > g.burst {
			wait = 1
		} else {
			wait = (cost + keep - g.tokens) / g.rate
		}
		if g.shadow {
			// Shadow mode: admitted without taking from the bucket, counted as admitted.
			g.admitShadow(cost)
			return 0, true
		}
	}
	if !g.started {
		g.firstCost = math.Max(g.firstCost, cost)
	}
	if count {
		g.refused(cost)
	}
	return wait, false
}

// takeUnthrottled admits unthrottled work whatever the bucket holds, and charges it to the
// bucket.
func (g *group) takeUnthrottled(cost, now float64) {
	if g.granted && !g.unlimited {
		g.refill(now)
		g.tokens -= cost
	}
	g.admit(cost, false)
	g.counts.Unthrottled += cost
}

func (g *group) refused(cost float64) {
	g.counts.Asked += cost
	g.counts.Throttled++
}

// admitShadow admits a request that shadow mode lets past a refusal, and counts it.
func (g *group) admitShadow(cost float64) {
	g.admit(cost, false)
	g.counts.WouldRefuse++
}

func (g *group) admit(cost float64, waited bool) {
	if cost > g.largest {
		g.largest = cost
	}
	c := &g.counts
	c.Asked += cost
	c.Admitted++
	c.Consumed += cost
	c.AdmittedUnits += cost
	if waited {
		c.Waited++
	}
}

// apply takes a grant in at now, answering a request sent then.
func (g *group) apply(grant *pb.Grant, sent, now float64) {
	g.refill(now)
	g.allot.set(grant.GetQuota(), sent, now)
	g.unlimited = grant.GetUnlimited()
	g.rate = grant.GetRate()
	if !g.started {
		if grant.GetClients() > 1 {
			// Shared with other processes: it starts with what one request needs.
			g.start = math.Min(g.start, math.Max(g.firstCost, 1))
		}
		if g.rate > 0 && !g.unlimited {
			g.tokens = math.Min(grant.GetBurst(), g.start)
			g.started = true
		}
	}
	g.burst = grant.GetBurst()
	g.tokens = math.Min(g.tokens, g.burst)
	g.last = g.rate
	g.reserved = grant.GetReserved()
	g.clients = math.Max(float64(grant.GetClients()), 1)
	g.shadow = grant.GetShadow()
	g.criticalReserve = grant.GetCriticalReserve()
	g.slots = -1
	if grant.GetInFlightLimited() {
		g.slots = int(grant.GetInFlight())
	}
	g.repayS = float64(grant.GetDebtRepayMs()) / 1000
	g.countDropped = grant.GetCountDropped()
	if g.unlimited {
		g.owed = 0
	}
	g.granted = true
}

// usage is what the group's part of an exchange carries, measured at now.
func (g *group) usage(now float64) *pb.GroupUsage {
	held := 0.0
	if g.granted && !g.unlimited {
		held = g.rate
	}
	r := g.meter.Report(now, g.counts, g.waiting, held, g.granted && !g.unlimited)
	c, last := g.classes, g.classesReported
	g.classesReported = c
	var detail *pb.Consumption
	if d := r.Detail; d != (Consumption{}) {
		detail = &pb.Consumption{Rru: d.RRU, Wru: d.WRU, ReadBytes: d.ReadBytes, WriteBytes: d.WriteBytes,
			CpuMs: d.CPUms, ReadRpcs: d.ReadRPCs, WriteRpcs: d.WriteRPCs}
	}
	var inFlight, inFlightAsked uint32
	if g.slots >= 0 {
		asked := g.asked
		if g.held+g.short > asked {
			asked = g.held + g.short
		}
		inFlight, inFlightAsked = uint32(g.held), uint32(math.Min(float64(asked), maxInFlight))
		g.asked, g.short = g.held, 0
	}
	largest := g.largest
	g.largest = 0
	return &pb.GroupUsage{
		Detail: detail, InFlight: inFlight, InFlightAsked: inFlightAsked, Largest: largest,
		Group: g.name, Demand: r.Demand, Consumed: r.Consumed, Admitted: r.Requests,
		Throttled: r.Throttled, WouldRefuse: r.WouldRefuse, Waiting: r.Waiting, Held: r.Held, Waited: r.Waited, Unthrottled: r.Unthrottled,
		CriticalAdmitted: c[0][0] - last[0][0], CriticalThrottled: c[0][1] - last[0][1],
		SheddableAdmitted: c[1][0] - last[1][0], SheddableThrottled: c[1][1] - last[1][1],
		// An allotment holds about two exchanges of demand (at a second each).
		Quota: g.allot.report(r.Demand * 4),
	}
}
