package tollgate_test

// TryAcquire beside golang.org/x/time/rate's Allow, both admitting every call (a group far
// below its limit): the cost of a decision. Run with `go test -bench . -run XXX` (test.sh's
// environment), the server TOLLGATE_BIN names started for the grant.

import (
	"context"
	"testing"
	"time"

	"golang.org/x/time/rate"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// granted starts the server and a limiter, and has the group "bench" (far below its limit)
// granted before the timer starts.
func granted(b *testing.B) *tollgate.Limiter {
	conn := testserver.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limit := 1e12
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: "bench", Patch: &pb.GroupPatch{Limit: &limit}, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		b.Fatal(err)
	}
	l, err := tollgate.New(conn, tollgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(l.Close)
	if _, err := l.Acquire(ctx, "bench", 1); err != nil {
		b.Fatal(err)
	}
	return l
}

func BenchmarkTryAcquire(b *testing.B) {
	l := granted(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.TryAcquire("bench", 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHandleTryAcquire(b *testing.B) {
	h, err := granted(b).Group("bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := h.TryAcquire(1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkXTimeRateAllow(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e12), 1e9)
	for i := 0; i < b.N; i++ {
		if !lim.Allow() {
			b.Fatal("refused")
		}
	}
}
