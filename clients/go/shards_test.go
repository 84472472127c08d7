package tollgate_test

// Groups sharded over two controllers on a real etcd (the one on PATH; ./scripts/test.sh
// installs it): the limiter, given one controller, sends each group's part straight to its
// owner once it holds the shard map, so no part is passed on between the controllers; and
// when an owner dies, its parts go through the controller given until the map is current.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

const shards = 8

// shardOf is a tree's shard as every controller computes it (FNV-1a of its root's name).
func shardOf(root string) uint32 {
	h := uint64(0xcbf29ce484222325)
	for _, b := range []byte(root) {
		h = (h ^ uint64(b)) * 0x100000001b3
	}
	return uint32(h % shards)
}

// shardedGroups is one group in every shard, so that each controller owns some of them.
func shardedGroups() []string {
	var out []string
	for s := uint32(0); s < shards; s++ {
		for i := 0; ; i++ {
			if name := fmt.Sprintf("tenant-%d", i); shardOf(name) == s {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metric is a sample's value on a server's /metrics (-1: not there, or no answer).
func metric(http_ string, name string) float64 {
	res, err := http.Get("http://" + http_ + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	lines := bufio.NewScanner(res.Body)
	for lines.Scan() {
		if rest := strings.TrimPrefix(lines.Text(), name+" "); rest != lines.Text() {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return -1
}

// sharded starts etcd and two controllers sharing 8 shards, each owning some, with a group
// in every shard.
func sharded(t *testing.T) []*testserver.Server {
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd is not on PATH: ./scripts/test.sh installs Debian's etcd-server")
	}
	dir := t.TempDir()
	client, peer := freePort(t), freePort(t)
	etcd := exec.Command(etcdBin, "--name=go", "--data-dir="+filepath.Join(dir, "etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", client),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", client),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-cluster=go=http://127.0.0.1:%d", peer))
	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = etcd.Process.Kill(); _ = etcd.Wait() })
	testserver.Eventually(t, "etcd answers", func() (bool, string) {
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", client))
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == 200, ""
	})
	flags := []string{"--etcd", fmt.Sprintf("http://127.0.0.1:%d", client), "--shards", strconv.Itoa(shards),
		"--election-lease-s", "1", "--tick-ms", "100", "--lease-ms", "1000"}
	var servers []*testserver.Server
	for i := 0; i < 2; i++ {
		servers = append(servers, testserver.Run(t, filepath.Join(dir, fmt.Sprintf("data-%d", i)), flags...))
	}
	testserver.Eventually(t, "every shard owned, each controller some", func() (bool, string) {
		sum := 0.0
		for _, s := range servers {
			owned := metric(s.HTTP, "tollgate_shards_owned")
			if owned < 1 {
				return false, ""
			}
			sum += owned
		}
		return sum == shards, ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range shardedGroups() {
		limit := 1000.0
		if _, err := pb.NewAdminClient(servers[0].Conn).PutGroup(ctx, &pb.PutGroupRequest{Name: g, Patch: &pb.GroupPatch{Limit: &limit}, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
			t.Fatal(err)
		}
	}
	return servers
}

func forwarded(servers []*testserver.Server) float64 {
	sum := 0.0
	for _, s := range servers {
		if v := metric(s.HTTP, `tollgate_shard_events_total{what="part_forwarded"}`); v > 0 {
			sum += v
		}
	}
	return sum
}

func acquireAll(t *testing.T, l *tollgate.Limiter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range shardedGroups() {
		permit, err := l.Acquire(ctx, g, 1)
		if err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		permit.Release()
	}
}

func TestALimiterSendsEachPartToItsOwner(t *testing.T) {
	servers := sharded(t)
	l := limiter(t, servers[0].Conn, tollgate.Options{ClientID: "go-routed"})
	acquireAll(t, l)
	// The first exchanges went whole to the controller given, which passed parts on.
	if forwarded(servers) == 0 {
		t.Fatal("no part was passed on between the controllers")
	}
	// The limiter learnt every group's shard, as the controllers compute it.
	testserver.Eventually(t, "every group's shard learnt", func() (bool, string) {
		learnt := tollgate.Shards(l)
		for _, g := range shardedGroups() {
			if s, ok := learnt[g]; !ok || s != shardOf(g) {
				return false, ""
			}
		}
		return true, ""
	})
	// Then a window of 2.5 s (more than two exchange periods) passes with no part passed on.
	for window := 1; ; window++ {
		before := forwarded(servers)
		time.Sleep(2500 * time.Millisecond)
		if forwarded(servers) == before {
			break
		}
		if window == 24 {
			t.Fatal("for a minute, parts were still passed on between the controllers")
		}
	}
	acquireAll(t, l)
	if l.Safe() {
		t.Fatal("in safe mode")
	}
	// The other controller dies: its shards move to the one given, the parts sent to it fail
	// and go through the controller given, and every group is granted again.
	servers[1].Stop()
	testserver.Eventually(t, "every shard owned by the survivor", func() (bool, string) {
		return metric(servers[0].HTTP, "tollgate_shards_owned") == shards, ""
	})
	acquireAll(t, l)
	if l.Safe() {
		t.Fatal("in safe mode after an owner died")
	}
}
