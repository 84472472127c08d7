package tollgate_test

// The limiter against the real server: a new group is served at once, a group's burst is
// held exactly, the safe mode's policies apply when no controller answers, and bad arguments
// are named.

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

func create(t *testing.T, conn *grpc.ClientConn, name string, limit, burst float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	patch := &pb.GroupPatch{Limit: &limit}
	if burst > 0 {
		patch.Burst = &burst
	}
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: name, Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
}

func limiter(t *testing.T, conn grpc.ClientConnInterface, opts tollgate.Options) *tollgate.Limiter {
	t.Helper()
	l, err := tollgate.New(conn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func TestANewGroupIsServedAtOnce(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "fresh", 1000, 0)
	l := limiter(t, conn, tollgate.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, "fresh", 1); err != nil {
		t.Fatal(err)
	}
	// And a group nobody configured, under the default group's settings.
	if _, err := l.Acquire(ctx, "walk-in", 1); err != nil {
		t.Fatal(err)
	}
}

func TestAGroupsBurstIsHeldExactly(t *testing.T) {
	conn := testserver.Start(t)
	// Three requests at once, then one per 100 s: what is admitted does not depend on speed.
	create(t, conn, "small", 0.01, 3)
	l := limiter(t, conn, tollgate.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, "small", 1); err != nil {
		t.Fatal(err)
	}
	admitted := 1
	var refused *tollgate.ErrThrottled
	for i := 0; i < 10; i++ {
		_, err := l.TryAcquire("small", 1)
		if err == nil {
			admitted++
		} else if !errors.As(err, &refused) {
			t.Fatal(err)
		}
	}
	if admitted != 3 || refused == nil || refused.Group != "small" || refused.RetryAfter < time.Second {
		t.Fatalf("admitted %d, refused %v", admitted, refused)
	}
	// A wait that cannot be met in time is refused when its context ends.
	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	if _, err := l.Acquire(short, "small", 1); !errors.As(err, &refused) {
		t.Fatalf("a wait past its context: %v", err)
	}
}

func TestTheSafeModesApplyWhenNoControllerAnswers(t *testing.T) {
	// A port nothing listens on: the first exchange fails, and the policy applies at once.
	conn, err := grpc.Dial("127.0.0.1:1", grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	open := limiter(t, conn, tollgate.Options{SafeMode: tollgate.FailOpen, ExchangeTimeout: 200 * time.Millisecond})
	closed := limiter(t, conn, tollgate.Options{SafeMode: tollgate.FailClosed, ExchangeTimeout: 200 * time.Millisecond})
	deadline := time.Now().Add(30 * time.Second)
	for !open.Safe() || !closed.Safe() {
		if time.Now().After(deadline) {
			t.Fatal("never in safe mode")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 5; i++ {
		if _, err := open.TryAcquire("any", 1); err != nil {
			t.Fatalf("fail-open refused: %v", err)
		}
		var refused *tollgate.ErrThrottled
		if _, err := closed.TryAcquire("any", 1); !errors.As(err, &refused) {
			t.Fatalf("fail-closed admitted: %v", err)
		}
	}
}

func TestBadArgumentsAreNamed(t *testing.T) {
	conn, err := grpc.Dial("127.0.0.1:1", grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	l := limiter(t, conn, tollgate.Options{})
	var bad *tollgate.ErrInvalidArgument
	for _, c := range []struct {
		group string
		cost  float64
		field string
	}{{"g", math.NaN(), "cost"}, {"g", -1, "cost"}, {"g", math.Inf(1), "cost"}, {"", 1, "group"}} {
		if _, err := l.TryAcquire(c.group, c.cost); !errors.As(err, &bad) || bad.Field != c.field {
			t.Errorf("%q %v: %v", c.group, c.cost, err)
		}
	}
	if _, err := tollgate.New(conn, tollgate.Options{SafeMode: 7}); !errors.As(err, &bad) || bad.Field != "SafeMode" {
		t.Errorf("SafeMode 7: %v", err)
	}
}

func TestAPermitSettledForMoreChargesTheBankAndForLessGivesBack(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "settled", 0.01, 3)
	l := limiter(t, conn, tollgate.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := l.Acquire(ctx, "settled", 1)
	if err != nil {
		t.Fatal(err)
	}
	// It cost nothing after all: its unit comes back, and three are admitted after it.
	if err := first.Settle(0); err != nil {
		t.Fatal(err)
	}
	if err := first.Settle(0); !errors.Is(err, tollgate.ErrSettled) {
		t.Fatalf("settled twice: %v", err)
	}
	var permits []*tollgate.Permit
	for i := 0; i < 3; i++ {
		p, err := l.TryAcquire("settled", 1)
		if err != nil {
			t.Fatalf("admission %d after the refund: %v", i, err)
		}
		permits = append(permits, p)
	}
	// Dropped work goes back to the group by default; work that cost more takes it again.
	if err := permits[0].Dropped(); err != nil {
		t.Fatal(err)
	}
	p, err := l.TryAcquire("settled", 1)
	if err != nil {
		t.Fatalf("after the drop: %v", err)
	}
	if err := p.Settle(2); err != nil {
		t.Fatal(err)
	}
	var refused *tollgate.ErrThrottled
	if _, err := l.TryAcquire("settled", 0.5); !errors.As(err, &refused) {
		t.Fatalf("after a charge past the bank: %v", err)
	}
	var bad *tollgate.ErrInvalidArgument
	if err := permits[1].Settle(math.NaN()); !errors.As(err, &bad) || bad.Field != "actual" {
		t.Fatalf("a NaN settlement: %v", err)
	}
}

func TestRequestClassesLeaveTheirShareOfTheBurst(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limit, burst, reserve := 0.01, 10.0, 0.5
	patch := &pb.GroupPatch{Limit: &limit, Burst: &burst, CriticalReserve: &reserve}
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: "classes", Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
	l := limiter(t, conn, tollgate.Options{})
	// The first grant, for nothing: the bucket starts full, ten units.
	if _, err := l.AcquireClass(ctx, "classes", 0, tollgate.Critical); err != nil {
		t.Fatal(err)
	}
	admitted := func(class tollgate.Class, tries int) int {
		n := 0
		for i := 0; i < tries; i++ {
			if _, err := l.TryAcquireClass("classes", 1, class); err == nil {
				n++
			}
		}
		return n
	}
	// Sheddable work leaves three quarters of the burst, normal work half, critical none.
	got := []int{admitted(tollgate.Sheddable, 5), admitted(tollgate.Normal, 5), admitted(tollgate.Critical, 10)}
	if got[0] != 2 || got[1] != 3 || got[2] != 5 {
		t.Fatalf("sheddable, normal, critical admitted: %v, want [2 3 5]", got)
	}
	var bad *tollgate.ErrInvalidArgument
	if _, err := l.TryAcquireClass("classes", 1, tollgate.Class(9)); !errors.As(err, &bad) || bad.Field != "class" {
		t.Fatalf("class 9: %v", err)
	}
}

func TestTheLimiterMovesToTheNextControllerWhenOneFails(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "moved", 1000, 0)
	dead, err := grpc.Dial("127.0.0.1:1", grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	// The first controller given answers nothing: the next one grants.
	l := limiter(t, dead, tollgate.Options{Others: []grpc.ClientConnInterface{conn}, ExchangeTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, "moved", 1); err != nil {
		t.Fatal(err)
	}
	if l.Safe() {
		t.Fatal("in safe mode with a controller answering")
	}
	var bad *tollgate.ErrInvalidArgument
	if _, err := tollgate.New(conn, tollgate.Options{Others: make([]grpc.ClientConnInterface, 16)}); !errors.As(err, &bad) || bad.Field != "Others" {
		t.Fatalf("16 others: %v", err)
	}
}

func TestUsageIsAdmittedUpFrontAndSettledInFull(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "priced", 0.01, 4)
	fdb, err := tollgate.FDB(4)
	if err != nil {
		t.Fatal(err)
	}
	cb := tollgate.Couchbase()
	l := limiter(t, conn, tollgate.Options{CostModel: cb})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.AcquireClass(ctx, "priced", 0, tollgate.Critical); err != nil {
		t.Fatal(err)
	}
	// A read of 10,000 bytes is admitted at one unit up front (its size is known only after),
	// then settled at three (⌈10000/4096⌉): four units in all leave none.
	read := tollgate.Usage{Bytes: 10000}
	p, err := l.TryAcquireUsage("priced", read)
	if err != nil || p.Cost != 1 {
		t.Fatalf("admitted %v, %v", p, err)
	}
	if err := p.SettleUsage(read); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire("priced", 1); err != nil {
		t.Fatalf("the fourth unit: %v", err)
	}
	var refused *tollgate.ErrThrottled
	if _, err := l.TryAcquire("priced", 0.5); !errors.As(err, &refused) {
		t.Fatalf("past four units: %v", err)
	}
	var bad *tollgate.ErrInvalidArgument
	if _, err := tollgate.New(conn, tollgate.Options{CostModel: tollgate.CostModel{Name: "gold"}}); !errors.As(err, &bad) || bad.Field != "cost_model" {
		t.Fatalf("a cost model named gold: %v", err)
	}
	if c, _ := fdb.Upfront(tollgate.Usage{Write: true, Bytes: 5000}); c != 32768 {
		t.Fatalf("an fdb write of 5000 bytes up front: %v", c)
	}
}

func TestAHandleAdmitsAsTheLimiterDoes(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "handled", 0.01, 2)
	l := limiter(t, conn, tollgate.Options{})
	h, err := l.Group("handled")
	if err != nil || h.Name() != "handled" {
		t.Fatal(h, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := h.TryAcquire(1); err != nil {
		t.Fatal(err)
	}
	var refused *tollgate.ErrThrottled
	if _, err := h.TryAcquire(1); !errors.As(err, &refused) || refused.Group != "handled" {
		t.Fatalf("past the burst: %v", err)
	}
	// The limiter's calls by name see the same bucket.
	if _, err := l.TryAcquire("handled", 1); !errors.As(err, &refused) {
		t.Fatalf("by name: %v", err)
	}
	var bad *tollgate.ErrInvalidArgument
	if _, err := l.Group(""); !errors.As(err, &bad) || bad.Field != "group" {
		t.Fatalf("no name: %v", err)
	}
	if _, err := h.TryAcquire(math.NaN()); !errors.As(err, &bad) || bad.Field != "cost" {
		t.Fatalf("a NaN cost: %v", err)
	}
}

func TestAnInFlightQuotaIsHeldAndPermitsGiveTheirSlotsBack(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limit, slots := 1e6, uint32(3)
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: "slots", Patch: &pb.GroupPatch{Limit: &limit, MaxInFlight: &slots}, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
	l := limiter(t, conn, tollgate.Options{})
	var held []*tollgate.Permit
	// The share follows what the client asks: it holds what it is allowed, never more than
	// the quota, until the whole quota is its own.
	for len(held) < 3 {
		if ctx.Err() != nil {
			t.Fatalf("never held the three slots: %d", len(held))
		}
		for i := 0; i < 5; i++ {
			p, err := l.TryAcquire("slots", 1)
			var refused *tollgate.ErrThrottled
			if errors.As(err, &refused) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		if len(held) > 3 {
			t.Fatalf("%d requests in flight, the quota is 3", len(held))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var refused *tollgate.ErrThrottled
	if _, err := l.TryAcquire("slots", 1); !errors.As(err, &refused) || refused.RetryAfter <= 0 {
		t.Fatalf("a fourth request in flight: %v", err)
	}
	// A slot comes back however a permit ends: released, settled, dropped.
	held[0].Release()
	held[0].Release() // at most once
	if _, err := l.TryAcquire("slots", 1); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := l.TryAcquire("slots", 1); !errors.As(err, &refused) {
		t.Fatalf("a release counted twice: %v", err)
	}
	if err := held[1].Settle(1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire("slots", 1); err != nil {
		t.Fatalf("after a settlement: %v", err)
	}
	if err := held[2].Dropped(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire("slots", 1); err != nil {
		t.Fatalf("after a drop: %v", err)
	}
}

func TestUnthrottledWorkIsAdmittedPastTheBucketAndChargedToIt(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "repairs", 0.01, 1)
	l := limiter(t, conn, tollgate.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, "repairs", 1); err != nil {
		t.Fatal(err)
	}
	var refused *tollgate.ErrThrottled
	if _, err := l.TryAcquire("repairs", 1); !errors.As(err, &refused) {
		t.Fatalf("past the burst: %v", err)
	}
	// A server without --auth allows every client unthrottled work.
	for i := 0; i < 3; i++ {
		if _, err := l.TryAcquireUnthrottled("repairs", 1); err != nil {
			t.Fatalf("unthrottled %d: %v", i, err)
		}
	}
	// Charged to the bucket: ordinary work waits for it to be paid back.
	if _, err := l.TryAcquire("repairs", 0.01); !errors.As(err, &refused) || refused.RetryAfter < 100*time.Second {
		t.Fatalf("after unthrottled work: %v", err)
	}
}
