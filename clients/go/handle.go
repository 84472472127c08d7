package tollgate

import "context"

// Handle is one group, resolved (Limiter.Group): the Limiter's calls without the name's look-up,
// the fastest way to admit. Safe for concurrent use.
type Handle struct {
	l *Limiter
	g *group
}

// Name is the group's name.
func (h *Handle) Name() string { return h.g.name }

// TryAcquire admits cost units now, or fails with *ErrThrottled.
func (h *Handle) TryAcquire(cost float64) (*Permit, error) { return h.l.tryAcquire(h.g, cost, Normal) }

// TryAcquireClass is TryAcquire for a request of class (see Limiter.TryAcquireClass).
func (h *Handle) TryAcquireClass(cost float64, class Class) (*Permit, error) {
	return h.l.tryAcquire(h.g, cost, class)
}

// TryAcquireUsage admits what usage is known to cost up front (see Limiter.TryAcquireUsage).
func (h *Handle) TryAcquireUsage(usage Usage) (*Permit, error) {
	cost, err := h.l.opts.CostModel.Upfront(usage)
	if err != nil {
		return nil, err
	}
	return h.l.tryAcquire(h.g, cost, Normal)
}

// Acquire admits cost units, waiting for them until ctx ends (see Limiter.Acquire).
func (h *Handle) Acquire(ctx context.Context, cost float64) (*Permit, error) {
	return h.l.acquire(ctx, h.g, cost, Normal)
}

// AcquireClass is Acquire for a request of class.
func (h *Handle) AcquireClass(ctx context.Context, cost float64, class Class) (*Permit, error) {
	return h.l.acquire(ctx, h.g, cost, class)
}
