// Package reporter is a backend's side of Tollgate for Go services: reports of the backend's
// health and of the groups loading it, and the soft limits the controller pushes back.
//
// A service records the units each group brings (Record). Every Interval the reporter folds
// what was recorded into each group's smoothed rate and sends the controller the busiest TopK
// groups at or above Threshold with the backend's health: the smoothed total over Capacity
// when a capacity is given, or what the Health function returns. The controller limits the
// groups loading a saturated backend. Each group's soft limit on the backend (backend_limit)
// comes back: SoftLimits holds the latest set, pulled at start and every CheckInterval and
// pushed by the controller after every change.
//
// docs/backend.md ("Backends in any language") describes the protocol field by field.
package reporter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// ReportGroupsMax is the most groups one report carries (the controller refuses more).
const ReportGroupsMax = 10000

// Health is a backend's health: utilisation (load over capacity, 1 at capacity) or queue
// bytes (the controller's target is 800e6 by default).
type Health struct {
	Utilisation float64
	QueueBytes  float64
	// Queue says which of the two this is.
	Queue bool
}

// Options say how the reporter behaves. BackendID and one of Capacity and Health are needed.
type Options struct {
	BackendID string // 1 to 255 bytes
	Zone      string // 1 to 255 bytes; "zone" when empty
	// How often to report (default 250 ms) and to pull the settings (default 10 s).
	Interval, CheckInterval time.Duration
	TopK                    int     // the busiest groups a report carries (default 10)
	Threshold               float64 // units/s a group needs to be reported
	Smoothing               time.Duration
	Capacity                float64 // units/s; 0: ask Health
	Health                  func() Health
	Token                   string // a backend token, for a server run with --auth
	Clock                   func() time.Time
}

// Reporter records served work and reports it; safe for concurrent use.
type Reporter struct {
	opts    Options
	backend pb.BackendClient
	mu      sync.Mutex
	window  map[string]float64
	rates   map[string]float64
	last    time.Time
	limits  map[string]float64
	version uint64
	// For each group of the last report served on other backends too: its units/s there.
	elsewhere map[string]float64
	// For each group of the last report with a limit: its share of it here.
	shares map[string]*pb.NodeShare
}

// New checks the options and makes a reporter on conn (a connection to a controller).
func New(conn grpc.ClientConnInterface, opts Options) (*Reporter, error) {
	if n := len(opts.BackendID); n < 1 || n > 255 {
		return nil, fmt.Errorf("BackendID: must be 1 to 255 bytes, got %d", n)
	}
	if opts.Zone == "" {
		opts.Zone = "zone"
	}
	if len(opts.Zone) > 255 {
		return nil, fmt.Errorf("Zone: must be 1 to 255 bytes, got %d", len(opts.Zone))
	}
	defaults := []struct {
		d    *time.Duration
		def  time.Duration
		rule string
	}{{&opts.Interval, 250 * time.Millisecond, "Interval"}, {&opts.CheckInterval, 10 * time.Second, "CheckInterval"}, {&opts.Smoothing, time.Second, "Smoothing"}}
	for _, d := range defaults {
		if *d.d == 0 {
			*d.d = d.def
		}
		if *d.d < 0 {
			return nil, fmt.Errorf("%s: must be above 0, got %v", d.rule, *d.d)
		}
	}
	if opts.TopK == 0 {
		opts.TopK = 10
	}
	if opts.TopK < 1 || opts.TopK > ReportGroupsMax {
		return nil, fmt.Errorf("TopK: must be 1 to %d, got %d", ReportGroupsMax, opts.TopK)
	}
	if !(opts.Threshold >= 0) || math.IsInf(opts.Threshold, 0) {
		return nil, fmt.Errorf("Threshold: must be a finite number of units/s, 0 or more, got %v", opts.Threshold)
	}
	if !(opts.Capacity >= 0) || math.IsInf(opts.Capacity, 0) {
		return nil, fmt.Errorf("Capacity: must be a finite number of units/s above 0, got %v", opts.Capacity)
	}
	if opts.Capacity == 0 && opts.Health == nil {
		return nil, errors.New("Health: give Capacity (utilisation is then the load over it) or a Health function")
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Reporter{
		opts: opts, backend: pb.NewBackendClient(conn),
		window: map[string]float64{}, rates: map[string]float64{}, last: opts.Clock(), limits: map[string]float64{},
	}, nil
}

// Record counts units of work served for group in the report under way; units that are not
// a finite number above 0 are ignored.
func (r *Reporter) Record(group string, units float64) {
	if !(units > 0) || math.IsInf(units, 0) || group == "" {
		return
	}
	r.mu.Lock()
	r.window[group] += units
	r.mu.Unlock()
}

// FoldWindow folds one window's units into each group's smoothed units/s: the window's own
// rate moves the smoothed one by 1 - exp(-elapsed/folding) of the gap, so a steady load
// settles on its true rate whatever the window's length. Loads that died away are forgotten.
func FoldWindow(rates, window map[string]float64, elapsed, folding float64) {
	keep := 1 - math.Exp(-elapsed/folding)
	for g, rate := range rates {
		rates[g] = rate + (window[g]/elapsed-rate)*keep
		delete(window, g)
	}
	for g, units := range window {
		rates[g] = units / elapsed * keep
		delete(window, g)
	}
	for g, rate := range rates {
		if rate <= 1e-6 {
			delete(rates, g)
		}
	}
}

func (r *Reporter) ctx(ctx context.Context) context.Context {
	if r.opts.Token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.opts.Token)
}

// ReportNow folds what was recorded since the last report and sends the report: the loads
// the controller left out, each as "loads[i].group: rule".
func (r *Reporter) ReportNow(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	now := r.opts.Clock()
	elapsed := now.Sub(r.last).Seconds()
	if elapsed <= 0 {
		r.mu.Unlock()
		return nil, nil
	}
	r.last = now
	FoldWindow(r.rates, r.window, elapsed, r.opts.Smoothing.Seconds())
	type load struct {
		group string
		rate  float64
	}
	loads, total := make([]load, 0, len(r.rates)), 0.0
	for g, rate := range r.rates {
		loads = append(loads, load{g, rate})
		total += rate
	}
	r.mu.Unlock()
	sort.Slice(loads, func(i, j int) bool {
		if loads[i].rate != loads[j].rate {
			return loads[i].rate > loads[j].rate
		}
		return loads[i].group < loads[j].group
	})
	report := &pb.BackendReport{BackendId: r.opts.BackendID, Zone: r.opts.Zone}
	for _, l := range loads {
		if l.rate >= r.opts.Threshold && len(report.Loads) < r.opts.TopK {
			report.Loads = append(report.Loads, &pb.GroupLoad{Group: l.group, UnitsPerS: l.rate})
		}
	}
	// The capacity configured; or the one a utilisation implies (the load over it).
	if r.opts.Capacity > 0 {
		report.Health = &pb.BackendReport_Utilisation{Utilisation: total / r.opts.Capacity}
		report.Capacity = &r.opts.Capacity
	} else if h := r.opts.Health(); h.Queue {
		report.Health = &pb.BackendReport_QueueBytes{QueueBytes: h.QueueBytes}
	} else {
		report.Health = &pb.BackendReport_Utilisation{Utilisation: h.Utilisation}
		if c := total / h.Utilisation; h.Utilisation > 0 && total > 0 && !math.IsInf(c, 0) {
			report.Capacity = &c
		}
	}
	ack, err := r.backend.Report(r.ctx(ctx), report)
	if err != nil {
		return nil, err
	}
	elsewhere := map[string]float64{}
	for _, l := range ack.GetElsewhere() {
		if u := l.GetUnitsPerS(); u > 0 && !math.IsInf(u, 0) {
			elsewhere[l.GetGroup()] = u
		}
	}
	shares := map[string]*pb.NodeShare{}
	for _, s := range ack.GetShares() {
		if u := s.GetUnitsPerS(); u > 0 && !math.IsInf(u, 0) {
			shares[s.GetGroup()] = s
		}
	}
	r.mu.Lock()
	r.elsewhere, r.shares = elsewhere, shares
	r.mu.Unlock()
	return ack.GetRejected(), nil
}

// Shares is, for each group of the last report with a limit, its share of the limit on this
// backend, as the controller answered: UnitsPerS (the limit in proportion to its load here),
// Ceiling (the most it may take here of capacity lent while the backend is idle) and the
// share in CPU milliseconds and bytes read and written per second.
func (r *Reporter) Shares() map[string]*pb.NodeShare {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*pb.NodeShare, len(r.shares))
	for g, s := range r.shares {
		out[g] = s
	}
	return out
}

// Elsewhere is, for each group of the last report that other backends serve too, its
// units/s on them, as the controller answered: dmClock's cross-backend term, which a fair
// queue charges each group as time passes, as if it had served that work itself.
func (r *Reporter) Elsewhere() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copied(r.elsewhere)
}

// copied is a copy of m, for a caller to keep.
func copied(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// RefreshSettings pulls the groups' settings, sending the version held: the controller
// answers "unchanged" or with the current set.
func (r *Reporter) RefreshSettings(ctx context.Context) error {
	r.mu.Lock()
	known := r.version
	r.mu.Unlock()
	answer, err := r.backend.GetSettings(r.ctx(ctx), &pb.GetSettingsRequest{KnownVersion: known})
	if err != nil {
		return err
	}
	r.take(answer)
	return nil
}

func (r *Reporter) take(s *pb.BackendSettings) {
	if s.GetUnchanged() {
		return
	}
	limits := map[string]float64{}
	for _, g := range s.GetGroups() {
		if g.GetSettings().BackendLimit != nil {
			limits[g.GetName()] = g.GetSettings().GetBackendLimit()
		}
	}
	r.mu.Lock()
	r.limits, r.version = limits, s.GetVersion()
	r.mu.Unlock()
}

// SoftLimits is each group's soft limit on this backend (backend_limit, units/s), as last
// heard from the controller; groups without one are absent.
func (r *Reporter) SoftLimits() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copied(r.limits)
}

// SettingsVersion is the version of the settings held (0: none heard yet).
func (r *Reporter) SettingsVersion() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// Run reports every Interval and keeps the soft limits current (a pull, then the
// controller's pushes until CheckInterval is up, then a pull again) until ctx ends. A report
// or a pull that fails is tried again at the next turn.
func (r *Reporter) Run(ctx context.Context) {
	go r.watch(ctx)
	ticker := time.NewTicker(r.opts.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			call, cancel := context.WithTimeout(ctx, r.opts.Interval+time.Second)
			_, _ = r.ReportNow(call)
			cancel()
		}
	}
}

func (r *Reporter) watch(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.RefreshSettings(ctx); err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		turn, cancel := context.WithTimeout(ctx, r.opts.CheckInterval)
		stream, err := r.backend.WatchSettings(r.ctx(turn), &pb.WatchSettingsRequest{})
		for err == nil {
			var pushed *pb.BackendSettings
			if pushed, err = stream.Recv(); err == nil {
				r.take(pushed)
			}
		}
		cancel()
	}
}
