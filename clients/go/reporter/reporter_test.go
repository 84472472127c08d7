package reporter_test

// The reporter against the real server: its reports reach the controller with the load and
// the utilisation (under a clock the test moves), the soft limits come back pulled and then
// pushed, and bad options name the field.

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	"github.com/tollgate-rs/tollgate/clients/go/reporter"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

func backend(t *testing.T, ctx context.Context, conn *grpc.ClientConn, name string) *pb.BackendStatus {
	t.Helper()
	status, err := pb.NewAdminClient(conn).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range status.GetBackendDetail() {
		if b.GetName() == name {
			return b
		}
	}
	return nil
}

func TestASteadyLoadSettlesOnItsRate(t *testing.T) {
	for _, c := range []struct{ window, folding float64 }{{1, 1}, {0.25, 1}, {2, 0.5}} {
		rates := map[string]float64{}
		for i := 0; i < int(200/c.window); i++ {
			reporter.FoldWindow(rates, map[string]float64{"g": 500 * c.window}, c.window, c.folding)
		}
		if math.Abs(rates["g"]-500) > 1e-6 {
			t.Fatalf("%v: %v", c, rates)
		}
	}
}

func TestAReportReachesTheControllerWithTheLoadAndTheUtilisation(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	now := time.Unix(1000, 0)
	r, err := reporter.New(conn, reporter.Options{
		BackendID: "kv-go", Zone: "zone-a", Capacity: 1000, Clock: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.Record("acme", 600)
	r.Record("globex", 150)
	r.Record("bad\nname", 5) // a control character: not a group's name
	now = now.Add(time.Second)
	rejected, err := r.ReportNow(ctx)
	if err != nil || len(rejected) != 1 || !strings.HasPrefix(rejected[0], "loads[2].group") {
		t.Fatalf("rejected %v, %v", rejected, err)
	}
	seen := backend(t, ctx, conn, "kv-go")
	share := 1 - math.Exp(-1) // one window as long as the folding time
	if seen == nil || seen.GetZone() != "zone-a" || math.Abs(seen.GetUtilisation()-755*share/1000) > 1e-9 {
		t.Fatalf("the backend as seen: %v", seen)
	}
	tops := seen.GetTopGroups()
	if len(tops) != 2 || tops[0].GetGroup() != "acme" || math.Abs(tops[0].GetUnitsPerS()-600*share) > 1e-9 {
		t.Fatalf("its top groups: %v", tops)
	}
}

func TestEachReportIsAnsweredWithWhatTheOtherBackendsServe(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	one, err := reporter.New(conn, reporter.Options{BackendID: "fan-1", Capacity: 1000, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	two, err := reporter.New(conn, reporter.Options{BackendID: "fan-2", Capacity: 1000, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	one.Record("spread", 600)
	one.Record("own", 100)
	two.Record("spread", 300)
	now = now.Add(time.Second)
	if _, err := one.ReportNow(ctx); err != nil || len(one.Elsewhere()) != 0 {
		t.Fatalf("before the second backend reports: %v, %v", one.Elsewhere(), err)
	}
	if _, err := two.ReportNow(ctx); err != nil {
		t.Fatal(err)
	}
	share := 1 - math.Exp(-1)
	got := two.Elsewhere()
	if len(got) != 1 || math.Abs(got["spread"]-600*share) > 1e-9 {
		t.Fatalf("what the other backend serves: %v", got)
	}
	// A group with a limit gets its share of it where its load lands (150 × 30 ÷ 90).
	limit := 150.0
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: "limited", Patch: &pb.GroupPatch{Limit: &limit}}); err != nil {
		t.Fatal(err)
	}
	one.Record("limited", 60)
	two.Record("limited", 30)
	now = now.Add(time.Second)
	if _, err := one.ReportNow(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := two.ReportNow(ctx); err != nil {
		t.Fatal(err)
	}
	held := two.Shares()["limited"]
	// Its capacity of 1,000 said, the share is a twentieth of the backend.
	if held == nil || math.Abs(held.GetUnitsPerS()-50) > 1e-6 || math.Abs(held.GetCeiling()-(150-60*share)) > 1e-6 || math.Abs(held.GetPart()-0.05) > 1e-9 {
		t.Fatalf("its share here: %v", held)
	}
}

func TestTheSoftLimitsComeBackPulledThenPushed(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := pb.NewAdminClient(conn)
	put := func(name string, backendLimit float64) {
		patch := &pb.GroupPatch{BackendLimit: &backendLimit}
		if _, err := admin.PutGroup(ctx, &pb.PutGroupRequest{Name: name, Patch: patch, Mode: pb.PutMode_PUT_MODE_UPSERT}); err != nil {
			t.Fatal(err)
		}
	}
	put("acme", 250)
	r, err := reporter.New(conn, reporter.Options{BackendID: "kv-go-2", Capacity: 100, CheckInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RefreshSettings(ctx); err != nil || r.SoftLimits()["acme"] != 250 || r.SettingsVersion() == 0 {
		t.Fatalf("pulled: %v, %v", r.SoftLimits(), err)
	}
	running, stop := context.WithCancel(ctx)
	defer stop()
	go r.Run(running)
	put("globex", 40)
	for r.SoftLimits()["globex"] != 40 {
		if ctx.Err() != nil {
			t.Fatalf("the push never came: %v", r.SoftLimits())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Record("acme", 5)
	for backend(t, ctx, conn, "kv-go-2") == nil {
		if ctx.Err() != nil {
			t.Fatal("the background reports never arrived")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBadOptionsNameTheField(t *testing.T) {
	conn := testserver.Start(t)
	for field, opts := range map[string]reporter.Options{
		"BackendID": {Capacity: 1},
		"Zone":      {BackendID: "b", Zone: strings.Repeat("z", 256), Capacity: 1},
		"TopK":      {BackendID: "b", TopK: reporter.ReportGroupsMax + 1, Capacity: 1},
		"Threshold": {BackendID: "b", Threshold: math.NaN(), Capacity: 1},
		"Capacity":  {BackendID: "b", Capacity: -1},
		"Health":    {BackendID: "b"},
		"Interval":  {BackendID: "b", Capacity: 1, Interval: -time.Second},
	} {
		if _, err := reporter.New(conn, opts); err == nil || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("%s: %v", field, err)
		}
	}
}
