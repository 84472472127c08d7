package tollgate

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// SafeMode is what a limiter does once the controller has not answered for a whole lease.
type SafeMode int

const (
	// Decay lets each group's last rate fall toward its share of the reservation
	// (reserved / clients), halving the gap every five seconds.
	Decay SafeMode = iota
	// FailOpen admits everything until the controller answers again.
	FailOpen
	// FailClosed refuses everything until the controller answers again.
	FailClosed
)

const (
	decayHalfLife          = 5.0
	backoffMin, backoffMax = 0.1, 2.0
	earlySpacing           = 0.05
	// ExchangeGroupsMax is the most groups one exchange carries (the server's bound); a
	// round carries more in pages of this many.
	ExchangeGroupsMax = 1000
	// GroupIdleExpiry is how long a group nothing was asked of stays in the exchanges, in
	// seconds (the server forgets a client's group after as long).
	GroupIdleExpiry = 240.0
	controllersMax  = 16
)

// Options say how a Limiter behaves; the zero value is the defaults.
type Options struct {
	// ClientID is how the server tells this process apart (1 to 128 bytes; default: one of
	// its own).
	ClientID string
	// Token is a client token, for a server run with --auth.
	Token string
	// SafeMode applies past the lease without an answer (default Decay).
	SafeMode SafeMode
	// ExchangeTimeout is each exchange's deadline (default 2 s).
	ExchangeTimeout time.Duration
	// CostModel prices TryAcquireUsage and Permit.SettleUsage (default Count()).
	CostModel CostModel
	// Others are further controllers sharing one etcd with the first (at most 15): the
	// limiter talks to one at a time and moves to the next when it fails, trying each once
	// before it backs off.
	Others []grpc.ClientConnInterface
	// OwnerDialOptions are how the limiter dials the controllers of a sharded cluster
	// (`tollgate server --shards`) at the addresses its shard map names, to send each group's
	// part of an exchange straight to its owner (default: grpc.WithInsecure()). Give the
	// credentials your own connections use.
	OwnerDialOptions []grpc.DialOption
}

// ErrThrottled is the error of a refusal: the group and when to try again.
type ErrThrottled struct {
	Group      string
	RetryAfter time.Duration
}

func (e *ErrThrottled) Error() string {
	return fmt.Sprintf("group %q is throttled: retry after %v", e.Group, e.RetryAfter)
}

// ErrInvalidArgument names the argument a call was refused for and the rule it breaks.
type ErrInvalidArgument struct{ Field, Rule string }

func (e *ErrInvalidArgument) Error() string { return e.Field + ": " + e.Rule }

var clients atomic.Uint64

// Limiter admits work by its cost, per group, fed by a tollgate server's grants: the Rust
// client's remote mode. Safe for concurrent use; Close stops its exchanges.
type Limiter struct {
	opts      Options
	admission []pb.AdmissionClient
	routes    *routes
	current   int // the controller talked to now
	failed    int // controllers failed since the last answer
	epoch     time.Time

	mu       sync.Mutex // guards the exchange's state below
	groups   sync.Map   // name: *group, read without l.mu on every admission
	sequence uint64
	answered bool        // an exchange was answered since the last failure
	ever     bool        // an exchange was ever answered
	safe     atomic.Bool // read without l.mu on every admission
	// Whether the controller lets this client admit unthrottled work (always without
	// authentication; with it, when the client's token carries the privilege).
	unthrottledAllowed atomic.Bool
	leaseEnd           float64
	nextTick           float64
	early              float64
	due                float64
	retryAt            float64 // after a failed exchange: no round before then, however urgent
	spaced             float64 // no early round for a refusal before then
	backoff            float64
	granted            chan struct{} // closed and replaced after every answer

	skipped atomic.Int64 // nanoseconds the tests moved the clock ahead by

	wake chan struct{}
	stop context.CancelFunc
	done chan struct{}
}

// New starts a limiter on conn, a connection to a controller.
func New(conn grpc.ClientConnInterface, opts Options) (*Limiter, error) {
	if opts.ClientID == "" {
		opts.ClientID = fmt.Sprintf("tollgate-go-%d-%d", os.Getpid(), clients.Add(1))
	}
	if n := len(opts.ClientID); n > 128 {
		return nil, &ErrInvalidArgument{"ClientID", fmt.Sprintf("must be 1 to 128 bytes, got %d", n)}
	}
	if opts.SafeMode < Decay || opts.SafeMode > FailClosed {
		return nil, &ErrInvalidArgument{"SafeMode", "must be Decay, FailOpen or FailClosed"}
	}
	if opts.CostModel.Name == "" {
		opts.CostModel = Count()
	}
	if _, err := opts.CostModel.Cost(Usage{}); err != nil {
		return nil, err
	}
	if opts.ExchangeTimeout == 0 {
		opts.ExchangeTimeout = 2 * time.Second
	}
	if opts.ExchangeTimeout < 0 {
		return nil, &ErrInvalidArgument{"ExchangeTimeout", "must be above 0"}
	}
	if len(opts.Others) > controllersMax-1 {
		return nil, &ErrInvalidArgument{"Others", fmt.Sprintf("at most %d further controllers, got %d", controllersMax-1, len(opts.Others))}
	}
	admission := []pb.AdmissionClient{pb.NewAdmissionClient(conn)}
	for _, c := range opts.Others {
		admission = append(admission, pb.NewAdmissionClient(c))
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &Limiter{
		opts: opts, admission: admission, routes: newRoutes(opts.OwnerDialOptions), epoch: time.Now(),
		backoff: backoffMin, granted: make(chan struct{}),
		wake: make(chan struct{}, 1), stop: stop, done: make(chan struct{}),
	}
	go l.run(ctx)
	return l, nil
}

// Close stops the limiter's exchanges.
func (l *Limiter) Close() {
	l.stop()
	<-l.done
}

// now is the limiter's clock, in seconds since it started (plus what the tests skip ahead).
func (l *Limiter) now() float64 {
	return (time.Since(l.epoch) + time.Duration(l.skipped.Load())).Seconds()
}

func checkCost(cost float64, field string) error {
	if !(cost >= 0) || math.IsInf(cost, 0) {
		return &ErrInvalidArgument{field, fmt.Sprintf("must be a finite number, 0 or more, got %v", cost)}
	}
	return nil
}

func checkCostClass(cost float64, class Class) error {
	if err := checkCost(cost, "cost"); err != nil {
		return err
	}
	return checkClass(class)
}

func checkGroup(name string) error {
	if n := len(name); n < 1 || n > 255 {
		return &ErrInvalidArgument{"group", fmt.Sprintf("must be 1 to 255 bytes, got %d", n)}
	}
	return nil
}

// group is the named group's state, made (and an exchange asked for at once) on first use.
func (l *Limiter) group(name string) *group {
	if g, ok := l.groups.Load(name); ok {
		return g.(*group)
	}
	l.mu.Lock()
	g, loaded := l.groups.LoadOrStore(name, newGroup(name, l.now()))
	if !loaded {
		l.early = 0
	}
	l.mu.Unlock()
	if !loaded {
		l.notify()
	}
	return g.(*group)
}

func (l *Limiter) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// attempt is one try for g: admitted, or the seconds until cost could fit.
func (l *Limiter) attempt(g *group, cost float64, class Class, waited, count bool) (bool, float64, bool) {
	safe := l.safe.Load()
	open := safe && l.opts.SafeMode == FailOpen
	closed := safe && l.opts.SafeMode == FailClosed
	g.mu.Lock()
	wait, ok, slot := g.take(cost, l.now(), class, open, closed, waited, count)
	granted, ask := g.granted, g.allot.wanted
	g.allot.wanted = false
	g.mu.Unlock()
	if !ok {
		l.mu.Lock()
		if granted && !ask {
			// Refused: exchange early, once the server's next tick has made new grants (and
			// not sooner than a short spacing after the last answer).
			l.early = math.Min(l.early, math.Max(l.nextTick, l.spaced))
		} else {
			// A new group before its first grant, or more of a quota's units asked for:
			// that exchange at once.
			l.early = 0
		}
		l.mu.Unlock()
		l.notify()
	}
	return ok, wait, slot
}

// TryAcquire admits cost units for group now, or fails with *ErrThrottled.
func (l *Limiter) TryAcquire(group string, cost float64) (*Permit, error) {
	return l.TryAcquireClass(group, cost, Normal)
}

// TryAcquireUsage admits what usage is known to cost up front (CostModel.Upfront by the
// limiter's cost model); settle the permit with the full usage afterwards (SettleUsage).
func (l *Limiter) TryAcquireUsage(group string, usage Usage) (*Permit, error) {
	cost, err := l.opts.CostModel.Upfront(usage)
	if err != nil {
		return nil, err
	}
	return l.TryAcquire(group, cost)
}

// TryAcquireUnthrottled admits cost units for group as unthrottled work (Couchbase's
// unthrottled privilege: a backend's own work, an operator's repair): admitted whatever the
// group's bucket holds, charged to it, and reported as unthrottled, which counts against the
// group and the node's capacity. Only while the controller allows this client unthrottled
// work (always on a server without --auth; with it, when the client's token carries the
// privilege); otherwise, and before the first answer, it is TryAcquire.
func (l *Limiter) TryAcquireUnthrottled(group string, cost float64) (*Permit, error) {
	if !l.unthrottledAllowed.Load() {
		return l.TryAcquire(group, cost)
	}
	if err := checkGroup(group); err != nil {
		return nil, err
	}
	if err := checkCost(cost, "cost"); err != nil {
		return nil, err
	}
	g := l.group(group)
	g.mu.Lock()
	g.takeUnthrottled(cost, l.now())
	g.mu.Unlock()
	return newPermit(l, g, cost, false), nil
}

// Group is a handle on one group: admission without looking its name up. The group's name
// is checked here, once.
func (l *Limiter) Group(name string) (*Handle, error) {
	if err := checkGroup(name); err != nil {
		return nil, err
	}
	return &Handle{l: l, g: l.group(name)}, nil
}

// TryAcquireClass is TryAcquire for a request of class: critical work may empty the group's
// bucket, normal work leaves its critical_reserve, sheddable work is refused first.
func (l *Limiter) TryAcquireClass(group string, cost float64, class Class) (*Permit, error) {
	if err := checkGroup(group); err != nil {
		return nil, err
	}
	return l.tryAcquire(l.group(group), cost, class)
}

func (l *Limiter) tryAcquire(g *group, cost float64, class Class) (*Permit, error) {
	if err := checkCostClass(cost, class); err != nil {
		return nil, err
	}
	ok, wait, slot := l.attempt(g, cost, class, false, true)
	if !ok {
		return nil, &ErrThrottled{g.name, time.Duration(wait * float64(time.Second))}
	}
	return newPermit(l, g, cost, slot), nil
}

// Acquire admits cost units for group, waiting for them (and for a new group's first grant)
// until ctx ends; then it fails with *ErrThrottled, at once when the units cannot come before
// the context's deadline. The request counts once in the demand
// reported, however long it waits, and its cost counts as waiting meanwhile.
func (l *Limiter) Acquire(ctx context.Context, group string, cost float64) (*Permit, error) {
	return l.AcquireClass(ctx, group, cost, Normal)
}

// AcquireClass is Acquire for a request of class (see TryAcquireClass).
func (l *Limiter) AcquireClass(ctx context.Context, group string, cost float64, class Class) (*Permit, error) {
	if err := checkGroup(group); err != nil {
		return nil, err
	}
	return l.acquire(ctx, l.group(group), cost, class)
}

func (l *Limiter) acquire(ctx context.Context, g *group, cost float64, class Class) (*Permit, error) {
	if err := checkCostClass(cost, class); err != nil {
		return nil, err
	}
	group := g.name
	ok, wait, slot := l.attempt(g, cost, class, false, false)
	if ok {
		return newPermit(l, g, cost, slot), nil
	}
	g.mu.Lock()
	g.waiting += cost
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.waiting -= cost
		g.mu.Unlock()
	}()
	for {
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline).Seconds() < wait {
			// The units cannot come before the context ends: refused now, not at its end.
			g.mu.Lock()
			g.refused(cost)
			g.countClass(class, false)
			g.mu.Unlock()
			return nil, &ErrThrottled{group, time.Duration(wait * float64(time.Second))}
		}
		l.mu.Lock()
		granted := l.granted
		l.mu.Unlock()
		pause := time.NewTimer(time.Duration(math.Max(wait, 0.001) * float64(time.Second)))
		select {
		case <-ctx.Done():
			pause.Stop()
			g.mu.Lock()
			g.refused(cost)
			g.countClass(class, false)
			g.mu.Unlock()
			return nil, &ErrThrottled{group, time.Duration(wait * float64(time.Second))}
		case <-granted:
			pause.Stop()
		case <-pause.C:
		}
		if ok, wait, slot = l.attempt(g, cost, class, true, false); ok {
			return newPermit(l, g, cost, slot), nil
		}
	}
}

// run is the exchange loop: a round when one is due, or asked for early (a new group, a
// refusal after the server's next tick).
func (l *Limiter) run(ctx context.Context) {
	defer close(l.done)
	defer l.routes.close()
	for ctx.Err() == nil {
		l.mu.Lock()
		now := l.now()
		if l.ever && !l.answered && now > l.leaseEnd {
			l.enterSafe(now)
		}
		wait := math.Max(math.Min(l.due, l.early), l.retryAt) - now
		l.mu.Unlock()
		if wait > 0 {
			timer := time.NewTimer(time.Duration(math.Min(wait, 0.1) * float64(time.Second)))
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-l.wake:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		l.round(ctx)
	}
}

// snapshot is what a round changed in a group's state as it reported it: put back when the
// round's page fails, so what it reported is reported again.
type snapshot struct {
	meter   DemandMeter
	classes [2][2]uint64
	asked   int
	short   int
}

// page is one exchange of a round: at most ExchangeGroupsMax groups.
type page struct {
	request *pb.ExchangeRequest
	saved   map[*group]snapshot
}

// round makes one exchange of every group's usage, a page of at most ExchangeGroupsMax
// groups at a time, and applies the answers.
func (l *Limiter) round(ctx context.Context) {
	l.mu.Lock()
	pages := l.pages(l.now())
	l.early = math.Inf(1)
	admission := l.admission[l.current]
	l.mu.Unlock()

	lease := math.Inf(1)
	for i, p := range pages {
		call, cancel := context.WithTimeout(ctx, l.opts.ExchangeTimeout)
		if l.opts.Token != "" {
			call = metadata.AppendToOutgoingContext(call, "authorization", "Bearer "+l.opts.Token)
		}
		sent := l.now()
		answer, err := l.routes.exchange(call, admission, p.request)
		cancel()
		now := l.now()
		l.mu.Lock()
		if err != nil {
			for _, unanswered := range pages[i:] {
				restore(unanswered.saved)
			}
			l.failedRound(now)
			l.mu.Unlock()
			return
		}
		lease = math.Min(lease, l.apply(answer, sent, now))
		l.mu.Unlock()
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !math.IsInf(lease, 1) {
		l.leaseEnd = now + lease
	}
	l.answered, l.ever, l.backoff, l.retryAt, l.failed = true, true, backoffMin, 0, 0
	l.safe.Store(false)
	l.spaced = now + earlySpacing
	l.early = math.Max(l.early, l.spaced)
	close(l.granted)
	l.granted = make(chan struct{})
}

// pages are this round's exchanges (l.mu held): every group asked for anything within the
// idle expiry, the busiest first when they take more than one page (new groups, then those
// with refusals or work waiting, then by demand). A group idle for longer is left out and
// takes a fresh grant before it admits again.
func (l *Limiter) pages(now float64) []page {
	type row struct {
		rank  int
		usage *pb.GroupUsage
		g     *group
	}
	var rows []row
	saved := map[*group]snapshot{}
	l.groups.Range(func(_, v interface{}) bool {
		g := v.(*group)
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.meter.Idle(now, g.counts, GroupIdleExpiry) && g.held == 0 && g.waiting == 0 {
			if g.granted {
				g.granted, g.started, g.tokens, g.start, g.firstCost = false, false, 0, math.Inf(1), 0
			}
			return true
		}
		saved[g] = snapshot{meter: *g.meter, classes: g.classesReported, asked: g.asked, short: g.short}
		u := g.usage(now)
		rank := 2
		if !g.granted || u.Throttled > 0 || u.Waiting > 0 {
			rank = 0
		} else if u.Admitted > 0 {
			rank = 1
		}
		rows = append(rows, row{rank, u, g})
		return true
	})
	if len(rows) > ExchangeGroupsMax {
		sort.SliceStable(rows, func(i, j int) bool {
			if rows[i].rank != rows[j].rank {
				return rows[i].rank < rows[j].rank
			}
			return rows[i].usage.Demand > rows[j].usage.Demand
		})
	}
	var pages []page
	for first := 0; first == 0 || first < len(rows); first += ExchangeGroupsMax {
		l.sequence++
		p := page{&pb.ExchangeRequest{ClientId: l.opts.ClientID, Sequence: l.sequence, TakesAllotments: true}, map[*group]snapshot{}}
		for _, r := range rows[first:int(math.Min(float64(first+ExchangeGroupsMax), float64(len(rows))))] {
			p.request.Groups = append(p.request.Groups, r.usage)
			p.saved[r.g] = saved[r.g]
		}
		pages = append(pages, p)
	}
	return pages
}

// restore puts back what an unanswered page's groups reported.
func restore(saved map[*group]snapshot) {
	for g, s := range saved {
		g.mu.Lock()
		*g.meter = s.meter
		g.classesReported, g.asked, g.short = s.classes, s.asked, s.short
		g.mu.Unlock()
	}
}

// failedRound moves to the next controller given, at once while some have not failed since
// the last answer; then the rounds back off (l.mu held).
func (l *Limiter) failedRound(now float64) {
	l.current = (l.current + 1) % len(l.admission)
	l.failed++
	if l.failed < len(l.admission) {
		l.due, l.retryAt = now, 0
		return
	}
	l.answered = false
	if !l.ever {
		// Never answered: no grant to ride on, so the policy applies at once.
		l.enterSafe(now)
	}
	l.due = now + l.backoff
	l.retryAt = l.due
	l.backoff = math.Min(l.backoff*2, backoffMax)
}

// apply takes one page's answer in (l.mu held): the shortest lease among its grants, in
// seconds (+Inf: none).
func (l *Limiter) apply(answer *pb.ExchangeResponse, sent, now float64) float64 {
	lease := math.Inf(1)
	for _, grant := range answer.GetGrants() {
		if v, ok := l.groups.Load(grant.GetGroup()); ok {
			g := v.(*group)
			g.mu.Lock()
			g.apply(grant, sent, now)
			g.mu.Unlock()
			lease = math.Min(lease, float64(grant.GetLeaseMs())/1000)
		}
	}
	l.unthrottledAllowed.Store(answer.GetUnthrottledAllowed())
	l.nextTick = now + float64(answer.GetNextTickMs())/1000
	l.due = now + math.Max(float64(answer.GetNextExchangeMs()), 10)/1000
	return lease
}

// enterSafe applies the safe mode's policy to every group (l.mu held).
func (l *Limiter) enterSafe(now float64) {
	l.safe.Store(true)
	if l.opts.SafeMode != Decay {
		return
	}
	elapsed := math.Max(now-l.leaseEnd, 0)
	l.groups.Range(func(_, v interface{}) bool {
		g := v.(*group)
		g.mu.Lock()
		if g.granted && !g.unlimited {
			floor := g.reserved / g.clients
			g.refill(now)
			g.rate = floor + (g.last-floor)*math.Pow(0.5, elapsed/decayHalfLife)
		}
		g.mu.Unlock()
		return true
	})
}

// Safe says whether the limiter is in safe mode: the controller has not answered for a
// whole lease (or ever).
func (l *Limiter) Safe() bool { return l.safe.Load() }
