// Package testserver starts the real Tollgate server for the module's tests.
package testserver

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc"
)

// Start runs `tollgate server` (the binary TOLLGATE_BIN names) on free loopback ports with
// flags, stopped when the test ends, and returns a connection to its gRPC port.
func Start(t testing.TB, flags ...string) *grpc.ClientConn {
	t.Helper()
	bin := os.Getenv("TOLLGATE_BIN")
	if bin == "" {
		t.Fatal("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
	}
	args := append([]string{"server", "--data", t.TempDir(), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"}, flags...)
	cmd := exec.Command(bin, args...)
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
	conn, err := grpc.Dial(words[4], grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
