package main

// The service run as a process of its own (this test binary, told so by its environment)
// beside the real server: it reports its load, and holds tenants to the soft limits pushed
// back.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

func TestMain(m *testing.M) {
	if os.Getenv("BACKENDSERVICE_RUN") != "" {
		main()
		return
	}
	os.Exit(m.Run())
}

func call(t *testing.T, address, method, path string, headers map[string]string) (int, http.Header, map[string]interface{}) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+address+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body := map[string]interface{}{}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, body
}

func TestTheServiceReportsItsLoadAndHoldsTenantsToTheirSoftLimits(t *testing.T) {
	conn := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := pb.NewAdminClient(conn)
	// A minute of a unit a second at once, then a unit a second: a second request of 60
	// units is refused unless a minute passed, whatever the machine's speed.
	limit, soft := 1000.0, 1.0
	for name, patch := range map[string]*pb.GroupPatch{
		"heavy": {Limit: &limit, BackendLimit: &soft},
		"light": {Limit: &limit},
	} {
		if _, err := admin.PutGroup(ctx, &pb.PutGroupRequest{Name: name, Patch: patch, Mode: pb.PutMode_PUT_MODE_CREATE}); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-listen", "127.0.0.1:0", "-server", conn.Target(), "-backend-id", "kv-example-go", "-capacity", "100", "-burst-s", "60"}
	service := exec.CommandContext(ctx, os.Args[0], args...)
	service.Env = append(os.Environ(), "BACKENDSERVICE_RUN=1")
	service.Stderr = os.Stderr
	stdout, err := service.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := service.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = service.Process.Kill(); _ = service.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on ") {
		t.Fatalf("the service said %q (%v)", line, err)
	}
	address := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))

	// The soft limits come from the controller at start.
	testserver.Eventually(t, "the soft limits", func() (bool, string) {
		_, _, limits := call(t, address, "GET", "/limits", nil)
		return len(limits) == 1 && limits["heavy"] == 1.0, fmt.Sprint(limits)
	})
	work := func(tenant string, units string) (int, http.Header, map[string]interface{}) {
		return call(t, address, "POST", "/work", map[string]string{"X-Tenant": tenant, "X-Units": units})
	}
	if code, _, body := work("heavy", "60"); code != 200 {
		t.Fatalf("the first minute's work was refused: %d %v", code, body)
	}
	code, headers, body := work("heavy", "60")
	retry, _ := strconv.Atoi(headers.Get("Retry-After"))
	if code != 429 || retry < 1 || body["tenant"] != "heavy" {
		t.Fatalf("past the soft limit: %d, Retry-After %q, %v", code, headers.Get("Retry-After"), body)
	}
	for i := 0; i < 3; i++ {
		if code, _, _ := work("light", "60"); code != 200 {
			t.Fatal("a tenant without a soft limit was held")
		}
	}
	for _, bad := range [][2]string{{"", "1"}, {"light", "-1"}, {"light", "lots"}} {
		if code, _, _ := work(bad[0], bad[1]); code != 400 {
			t.Fatalf("%v: %d, not 400", bad, code)
		}
	}
	// Its reports reach the controller: the backend, with the tenants it served.
	testserver.Eventually(t, "the backend's reports", func() (bool, string) {
		status, err := admin.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range status.GetBackendDetail() {
			seen := map[string]bool{}
			for _, g := range b.GetTopGroups() {
				seen[g.GetGroup()] = true
			}
			if b.GetName() == "kv-example-go" && seen["heavy"] && seen["light"] && len(seen) == 2 && b.GetUtilisation() > 0 {
				return true, ""
			}
		}
		return false, fmt.Sprint(status.GetBackendDetail())
	})
}
