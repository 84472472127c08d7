package tollgate

import (
	"errors"
	"sync/atomic"
)

// Permit is an admitted request. Settle it with what it really cost: more than admitted
// becomes debt, less is given back. Dropped says the work was never done. Left unsettled, the
// admitted cost stands.
type Permit struct {
	// Group is the group it was admitted for, Cost the cost admitted.
	Group   string
	Cost    float64
	l       *Limiter
	g       *group
	settled atomic.Bool
	slot    atomic.Bool // holds one of the group's in-flight slots
}

func newPermit(l *Limiter, g *group, cost float64, slot bool) *Permit {
	p := &Permit{Group: g.name, Cost: cost, l: l, g: g}
	p.slot.Store(slot)
	return p
}

// Release gives back the group's in-flight slot the permit holds, if any (a group with
// max_in_flight): done by Settle, SettleUsage and Dropped too, at most once.
func (p *Permit) Release() {
	if p.slot.CompareAndSwap(true, false) {
		p.g.mu.Lock()
		p.g.held--
		p.g.mu.Unlock()
	}
}

// ErrSettled is the error of a second Settle or Dropped on one permit.
var ErrSettled = errors.New("this permit is settled already")

// Settle says the request cost actual units rather than the cost admitted: the difference is
// charged (into debt, paid back over the group's debt_repay_s, when the bank is short) or
// given back, and reported as consumed.
func (p *Permit) Settle(actual float64) error {
	if err := checkCost(actual, "actual"); err != nil {
		return err
	}
	return p.finish(func(g *group, now float64) {
		if delta := actual - p.Cost; delta > 0 {
			g.charge(delta, now)
			g.counts.Consumed += delta
		} else if delta < 0 {
			g.refund(-delta, now)
			g.counts.Consumed += delta
		}
	})
}

// SettleUsage settles with what the request did, priced by the limiter's cost model; what it
// did is also reported to the controller in detail (TiDB's read and write request units,
// bytes, CPU and requests).
func (p *Permit) SettleUsage(usage Usage) error {
	detail, err := p.l.opts.CostModel.consumption(usage)
	if err != nil {
		return err
	}
	if err := p.Settle(detail.RRU + detail.WRU); err != nil {
		return err
	}
	p.g.mu.Lock()
	p.g.counts.Detail = p.g.counts.Detail.plus(detail)
	p.g.mu.Unlock()
	return nil
}

// Dropped says the work was never done (Numaflow's dropped messages): by the group's dropped
// setting its cost goes back to the group (return, the default) or stays consumed (count).
func (p *Permit) Dropped() error {
	return p.finish(func(g *group, now float64) {
		if !g.countDropped {
			g.refund(p.Cost, now)
			g.counts.Consumed -= p.Cost
		}
	})
}

// finish ends the permit once (ErrSettled after that): its slot given back, then f run on its
// group, locked, at the limiter's time now.
func (p *Permit) finish(f func(g *group, now float64)) error {
	if !p.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	p.Release()
	g := p.g
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g, p.l.now())
	return nil
}
