package tollgate

import (
	"math"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// The smallest allotment of a group's quotas worth holding (the server's own floor), and how
// soon a request refused for want of one tries again when more was asked for at once.
const allotmentMin, allotmentRetry = 1.0, 0.02

// allotment is what a client holds of a group's quotas per window (minute, hour, day…, or
// the group's whole life): units it may admit in the window under way on top of its rate,
// handed out by the controller so that the clients together never overrun a quota. Times are
// seconds on the limiter's clock.
type allotment struct {
	on bool
	// The window it came for (its start, Unix milliseconds), units given and used in it.
	window uint64
	given  float64
	used   float64
	ends   float64 // +Inf: never (a quota over the group's life)
	left   float64 // units the controller had beyond every allotment, at its last answer
	reset  float64 // when a spent window starts afresh (+Inf: not known)
	wanted bool    // spent with units left at the controller: ask again at once
}

// take takes cost from the allotment: 0 when taken (or the group has no quotas per window),
// else the seconds to wait before trying again.
func (a *allotment) take(cost, now float64) float64 {
	if !a.on {
		return 0
	}
	live := now < a.ends
	if live && a.used+cost <= a.given+1e-6 {
		a.used += cost
		return 0
	}
	if !live || a.left > 0 {
		a.wanted = true
		return allotmentRetry
	}
	if !math.IsInf(a.reset, 1) {
		return math.Max(a.reset-now, allotmentRetry)
	}
	return 1
}

// giveBack returns cost taken for a request the bucket then refused.
func (a *allotment) giveBack(cost float64) {
	if a.on {
		a.used = math.Max(a.used-cost, 0)
	}
}

// report is what the group holds of its allotment, for an exchange (nil: no quotas). Past
// keep units unspent, the rest is given back.
func (a *allotment) report(keep float64) *pb.QuotaHeld {
	if !a.on {
		return nil
	}
	keep = math.Max(keep, allotmentMin)
	if a.given-a.used > keep {
		a.given = a.used + keep
	}
	return &pb.QuotaHeld{Window: a.window, Given: a.given, Used: a.used}
}

// set takes in what a grant carries (nil: the group has no quotas per window); the allotment
// runs from sent, when the exchange's request was made, so it ends before the server's window.
func (a *allotment) set(q *pb.QuotaAllotment, sent, now float64) {
	if q == nil {
		a.on = false
		return
	}
	if !a.on || a.window != q.GetWindow() {
		a.window, a.given, a.used = q.GetWindow(), 0, 0
	}
	if add := q.GetAdd(); add > 0 && !math.IsInf(add, 0) && !math.IsNaN(add) {
		a.given += add
	}
	a.ends = math.Inf(1)
	if ms := q.GetEndsInMs(); ms > 0 {
		a.ends = sent + float64(ms)/1000
	}
	a.left = 0
	if left := q.GetLeft(); left > 0 && !math.IsInf(left, 0) {
		a.left = left
	}
	a.reset = math.Inf(1)
	if q.ResetInMs != nil {
		a.reset = now + float64(q.GetResetInMs())/1000
	}
	a.on = true
}
