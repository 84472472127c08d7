package tollgate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

func TestAGroupInShadowModeIsNeverRefusedAndCountsWhatItWouldRefuse(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limit, burst, shadow := 0.01, 10.0, true
	admin := pb.NewAdminClient(conn)
	patch := &pb.GroupPatch{Limit: &limit, Burst: &burst, Shadow: &shadow}
	if _, err := admin.PutGroup(ctx, &pb.PutGroupRequest{Name: "dark", Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
	l := limiter(t, conn, tollgate.Options{})
	if _, err := l.Acquire(ctx, "dark", 0); err != nil {
		t.Fatal(err)
	}
	// The bucket holds 10: the other 5 would have been refused, and are admitted all the same.
	for i := 0; i < 15; i++ {
		if _, err := l.TryAcquire("dark", 1); err != nil {
			t.Fatalf("request %d refused in shadow mode: %v", i, err)
		}
	}
	var dark *pb.GroupStatus
	testserver.Eventually(t, "the server counts the 16 admissions", func() (bool, string) {
		for _, g := range testserver.Groups(t, conn) {
			if g.GetName() == "dark" {
				dark = g
			}
		}
		return dark.GetAdmittedTotal() == 16, fmt.Sprintf("%v", dark)
	})
	if dark.GetWouldRefuseTotal() != 5 || dark.GetThrottledTotal() != 0 {
		t.Fatalf("the server counts %d would-be refusals and %d refusals, not 5 and 0", dark.GetWouldRefuseTotal(), dark.GetThrottledTotal())
	}
}

// Each exchange tells the largest request admitted since the last one: the controller keeps
// the group's high-water mark.
func TestTheLargestRequestReachesTheGroupsMarks(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limit := 1000.0
	admin := pb.NewAdminClient(conn)
	patch := &pb.GroupPatch{Limit: &limit}
	if _, err := admin.PutGroup(ctx, &pb.PutGroupRequest{Name: "reports", Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
	l := limiter(t, conn, tollgate.Options{})
	for _, cost := range []float64{1, 40, 3} {
		if _, err := l.Acquire(ctx, "reports", cost); err != nil {
			t.Fatal(err)
		}
	}
	testserver.Eventually(t, "the group's largest request is 40", func() (bool, string) {
		for _, g := range testserver.Groups(t, conn) {
			if g.GetName() == "reports" {
				return g.GetLargestLastMinute() == 40, fmt.Sprintf("%v", g)
			}
		}
		return false, "no group reports"
	})
}
