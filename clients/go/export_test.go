package tollgate

import "time"

// Skip moves l's clock ahead by d, for the tests of what takes minutes.
func Skip(l *Limiter, d time.Duration) {
	l.skipped.Add(int64(d))
	l.notify()
}

// Granted says whether l holds a grant for the group.
func Granted(l *Limiter, name string) bool {
	v, ok := l.groups.Load(name)
	if !ok {
		return false
	}
	g := v.(*group)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.granted
}

// Rate is the rate of l's grant for the group (0: none yet).
func Rate(l *Limiter, name string) float64 {
	v, ok := l.groups.Load(name)
	if !ok {
		return 0
	}
	g := v.(*group)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rate
}

// Shards is the shard of each group l learnt.
func Shards(l *Limiter) map[string]uint32 {
	l.routes.mu.Lock()
	defer l.routes.mu.Unlock()
	out := map[string]uint32{}
	for k, v := range l.routes.shards {
		out[k] = v
	}
	return out
}
