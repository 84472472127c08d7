package tollgatev1_test

// The generated code against the real server (TOLLGATE_BIN): an admin call makes a group, an
// exchange for it is granted within its limit, and a call the server refuses comes back as
// INVALID_ARGUMENT naming the field.

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

func TestTheGeneratedCodeSpeaksToTheServer(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	limit := 40.0
	made, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{
		Name: "go-made", Patch: &pb.GroupPatch{Limit: &limit}, Mode: pb.PutMode_PUT_MODE_CREATE,
	})
	if err != nil || made.GetSettings().GetLimit() != 40 {
		t.Fatalf("PutGroup: %v, %v", made, err)
	}

	exchange := pb.NewAdmissionClient(conn)
	var grant *pb.Grant
	for sequence := uint64(1); grant == nil && sequence <= 100; sequence++ {
		answer, err := exchange.Exchange(ctx, &pb.ExchangeRequest{
			ClientId: "go-contract", Sequence: sequence,
			Groups: []*pb.GroupUsage{{Group: "go-made", Demand: 100}},
		})
		if err != nil {
			t.Fatalf("Exchange: %v", err)
		}
		for _, g := range answer.GetGrants() {
			if g.GetGroup() == "go-made" && g.GetRate() > 0 {
				grant = g
			}
		}
	}
	if grant == nil || grant.GetUnlimited() || grant.GetRate() > limit+1e-9 {
		t.Fatalf("a grant within the limit of %v: %v", limit, grant)
	}

	_, err = exchange.Exchange(ctx, &pb.ExchangeRequest{ClientId: ""})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "client_id") {
		t.Fatalf("an empty client_id: %v", err)
	}
}
