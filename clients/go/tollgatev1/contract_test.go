package tollgatev1_test

// The generated code against the real server (TOLLGATE_BIN): an admin call makes a group, an
// exchange for it is granted within its limit, and a call the server refuses comes back as
// INVALID_ARGUMENT naming the field.

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// server starts `tollgate server` on free loopback ports and returns its gRPC address.
func server(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TOLLGATE_BIN")
	if bin == "" {
		t.Fatal("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
	}
	cmd := exec.Command(bin, "server", "--data", t.TempDir(), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	words := strings.Fields(line)
	if err != nil || len(words) < 5 || words[2] != "listening:" {
		t.Fatalf("the server said %q (%v)", line, err)
	}
	return words[4]
}

func TestTheGeneratedCodeSpeaksToTheServer(t *testing.T) {
	conn, err := grpc.Dial(server(t), grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
