package tollgate_test

// Limits held across processes, each a limiter of its own on the real server: a quota is a
// count, never overrun however many processes ask for it flat out, and a group's reservation
// holds against a heavier neighbour.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// TestProcessAsking is one of the processes the tests start: it asks for one unit of a group
// at a time, flat out, printing how many it was admitted after each admission, until its
// standard input closes; then it prints "final N".
func TestProcessAsking(t *testing.T) {
	addr, group := os.Getenv("TOLLGATE_TEST_ADDR"), os.Getenv("TOLLGATE_TEST_GROUP")
	if addr == "" {
		t.Skip("a process the other tests start")
	}
	conn, err := grpc.Dial(addr, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	l := limiter(t, conn, tollgate.Options{})
	stdin, stop := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	admitted := 0
	for {
		select {
		case <-stdin.Done():
			fmt.Printf("final %d\n", admitted)
			return
		default:
		}
		if _, err := l.TryAcquire(group, 1); err == nil {
			admitted++
			fmt.Printf("%d\n", admitted)
			continue
		}
		time.Sleep(time.Millisecond)
	}
}

// processes ask for a group flat out, each a TestProcessAsking of its own.
type processes struct {
	t       *testing.T
	mu      sync.Mutex
	counts  []int // what each was admitted, as it last said
	finals  []int
	cmds    []*exec.Cmd
	stdins  []io.Closer
	readers sync.WaitGroup
}

// asking starts n processes asking for group flat out; they stop when the test ends.
func asking(t *testing.T, conn *grpc.ClientConn, group string, n int) *processes {
	t.Helper()
	ps := &processes{t: t, counts: make([]int, n), finals: make([]int, n)}
	for i := 0; i < n; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProcessAsking$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TOLLGATE_TEST_ADDR="+conn.Target(), "TOLLGATE_TEST_GROUP="+group)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		ps.cmds, ps.stdins = append(ps.cmds, cmd), append(ps.stdins, stdin)
		ps.readers.Add(1)
		go ps.read(i, stdout)
	}
	return ps
}

// read takes in what process i says.
func (ps *processes) read(i int, stdout io.Reader) {
	defer ps.readers.Done()
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		ps.mu.Lock()
		if rest := strings.TrimPrefix(line, "final "); rest != line {
			ps.finals[i], _ = strconv.Atoi(rest)
		} else if v, err := strconv.Atoi(line); err == nil {
			ps.counts[i] = v
		}
		ps.mu.Unlock()
	}
}

// until waits until the processes were admitted want units in all, or a minute passed.
func (ps *processes) until(want int) {
	deadline := time.Now().Add(time.Minute)
	for {
		ps.mu.Lock()
		sum := 0
		for _, c := range ps.counts {
			sum += c
		}
		counts := append([]int(nil), ps.counts...)
		ps.mu.Unlock()
		if sum >= want {
			return
		}
		if time.Now().After(deadline) {
			ps.t.Errorf("after a minute the processes were admitted %v, not %d in all", counts, want)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop stops the processes: what each was admitted in all.
func (ps *processes) stop() []int {
	for _, stdin := range ps.stdins {
		_ = stdin.Close()
	}
	ps.readers.Wait()
	for i, cmd := range ps.cmds {
		if err := cmd.Wait(); err != nil {
			ps.t.Fatalf("process %d: %v", i, err)
		}
	}
	return ps.finals
}

func TestAQuotaIsACountThreeProcessesAskingFlatOutAdmitExactlyIt(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limit := 1e6
	patch := &pb.GroupPatch{Limit: &limit, Quotas: map[string]float64{"total": 300}}
	if _, err := pb.NewAdminClient(conn).PutGroup(ctx, &pb.PutGroupRequest{Name: "counted", Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
		t.Fatal(err)
	}
	ps := asking(t, conn, "counted", 3)
	ps.until(300)
	finals := ps.stop()
	sum := 0
	for _, f := range finals {
		sum += f
	}
	t.Logf("admitted by each process: %v", finals)
	if sum != 300 {
		t.Fatalf("the processes were admitted %v, %d in all, not the quota's 300", finals, sum)
	}
	// Spent: not one more, whoever asks.
	l := limiter(t, conn, tollgate.Options{})
	for i := 0; i < 3; i++ {
		_, err := l.Acquire(ctx, "counted", 1)
		var refused *tollgate.ErrThrottled
		if !errors.As(err, &refused) {
			t.Fatalf("admitted past the quota: %v", err)
		}
	}
}

func TestAReservationHoldsAgainstAHeavierNeighbourInOtherProcesses(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := pb.NewAdminClient(conn)
	capacity := 1000.0
	if _, err := admin.SetCapacity(ctx, &pb.SetCapacityRequest{Capacity: &capacity}); err != nil {
		t.Fatal(err)
	}
	// By weight alone the small group's share of the capacity would be 1/11 (91 units/s).
	for name, patch := range map[string]*pb.GroupPatch{
		"small": {Reserved: pointer(200.0), Weight: pointer(1.0)},
		"noisy": {Weight: pointer(10.0)},
	} {
		if _, err := admin.PutGroup(ctx, &pb.PutGroupRequest{Name: name, Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
			t.Fatal(err)
		}
	}
	l := limiter(t, conn, tollgate.Options{})
	go func() {
		for ctx.Err() == nil {
			if _, err := l.TryAcquire("small", 1); err != nil {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	asking(t, conn, "noisy", 2)
	testserver.Eventually(t, "small held at its reservation beside noisy", func() (bool, string) {
		targets := map[string]float64{}
		for _, g := range testserver.Groups(t, conn) {
			targets[g.GetName()] = g.GetTarget()
		}
		// A reservation holds even the moment its group wakes: until the next tick takes
		// back what was lent, the targets may pass the capacity by the idle reservation.
		if sum := targets["small"] + targets["noisy"]; sum > (capacity+200)*1.001 {
			t.Fatalf("the targets %v add up past the capacity and the reservation", targets)
		}
		// The small group's own grant, as its client holds it, beside the noisy one's target.
		small, noisy := tollgate.Rate(l, "small"), targets["noisy"]
		return small >= 200*0.999 && noisy >= 700, fmt.Sprintf("small holds %.1f units/s (reserved 200), noisy %.1f", small, noisy)
	})
}

func pointer(v float64) *float64 { return &v }
