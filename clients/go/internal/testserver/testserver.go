// Package testserver starts the real Tollgate server for the module's tests.
package testserver

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// Start runs `tollgate server` (the binary TOLLGATE_BIN names) on free loopback ports with
// flags, stopped when the test ends, and returns a connection to its gRPC port.
func Start(t testing.TB, flags ...string) *grpc.ClientConn {
	t.Helper()
	return Run(t, t.TempDir(), flags...).Conn
}

// Server is a server Run started.
type Server struct {
	Conn *grpc.ClientConn
	// Its gRPC and HTTP addresses (HOST:PORT).
	GRPC, HTTP string
	cmd        *exec.Cmd
}

// Stop stops the server at once.
func (s *Server) Stop() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() }

// Run is Start with the server's data in data, and what it listens on.
func Run(t testing.TB, data string, flags ...string) *Server {
	t.Helper()
	bin := os.Getenv("TOLLGATE_BIN")
	if bin == "" {
		t.Fatal("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
	}
	args := append([]string{"server", "--data", data, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"}, flags...)
	cmd := exec.Command(bin, args...)
	logs := &firstBytes{}
	cmd.Stderr = logs
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
	if err != nil || len(words) < 7 || words[2] != "listening:" {
		_ = cmd.Wait()
		t.Fatalf("the server said %q (%v) and logged:\n%s", line, err, logs.String())
	}
	conn, err := grpc.Dial(words[4], grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &Server{Conn: conn, GRPC: words[4], HTTP: words[6], cmd: cmd}
}

// firstBytes keeps the first 64 KiB written to it: a server's first log lines.
type firstBytes struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (f *firstBytes) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if room := 64<<10 - f.buf.Len(); room > 0 {
		if len(p) > room {
			f.buf.Write(p[:room])
		} else {
			f.buf.Write(p)
		}
	}
	return len(p), nil
}

func (f *firstBytes) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.String()
}

// Eventually looks every 50 ms, for up to a minute (a bound for a stuck test, not a timing
// assertion), until done says yes; else it fails the test saying what never happened and
// what done said last.
func Eventually(t testing.TB, what string, done func() (bool, string)) {
	t.Helper()
	last := ""
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var ok bool
		if ok, last = done(); ok {
			return
		}
	}
	t.Fatalf("never happened: %s (%s)", what, last)
}

// Groups is every group's status on the server at conn, a page at a time.
func Groups(t testing.TB, conn grpc.ClientConnInterface) []*pb.GroupStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var groups []*pb.GroupStatus
	for token := ""; ; {
		status, err := pb.NewAdminClient(conn).Status(ctx, &pb.StatusRequest{PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, status.GetGroups()...)
		if token = status.GetNextPageToken(); token == "" {
			return groups
		}
	}
}
