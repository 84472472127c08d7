package tollgate_test

// The net/http middleware and the gRPC interceptor in front of real servers, fed by the real
// controller: three requests of a burst of three are served, the next refused with 429 or
// RESOURCE_EXHAUSTED and a retry-after, another tenant is served, a missing tenant is a bad
// request.

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
)

func TestTheHTTPMiddlewareAnswers429WithRetryAfter(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "acme", 0.01, 3)
	create(t, conn, "globex", 1000, 0)
	l := limiter(t, conn, tollgate.Options{})
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("served")) })
	// A first grant may take an exchange: the middleware waits for it up to 30 s.
	site := httptest.NewServer(l.Middleware(tollgate.TenantHeader, 30*time.Second)(ok))
	defer site.Close()
	get := func(tenant string) *http.Response {
		req, _ := http.NewRequest("GET", site.URL, nil)
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// The wait is for a new group's grant or for tokens within the wait: with one per 100 s,
	// the fourth request's wait is past 30 s and it is refused at once.
	for i := 0; i < 3; i++ {
		if resp := get("acme"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	refused := get("acme")
	var body map[string]interface{}
	_ = json.NewDecoder(refused.Body).Decode(&body)
	after, _ := strconv.Atoi(refused.Header.Get("Retry-After"))
	if refused.StatusCode != 429 || after < 1 || body["group"] != "acme" {
		t.Fatalf("refused: %d, Retry-After %q, %v", refused.StatusCode, refused.Header.Get("Retry-After"), body)
	}
	if resp := get("globex"); resp.StatusCode != 200 {
		t.Fatalf("another tenant: %d", resp.StatusCode)
	}
	if resp := get(""); resp.StatusCode != 400 {
		t.Fatalf("no tenant: %d", resp.StatusCode)
	}
}

func TestTheGRPCInterceptorAnswersResourceExhausted(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "acme", 0.01, 3)
	l := limiter(t, conn, tollgate.Options{})
	server := grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServerInterceptor(tollgate.TenantMetadata, 30*time.Second)))
	healthpb.RegisterHealthServer(server, health.NewServer())
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(listener) }()
	defer server.Stop()
	client, err := grpc.Dial(listener.Addr().String(), grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check := func(tenant string) (metadata.MD, error) {
		var header metadata.MD
		call := metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant)
		_, err := healthpb.NewHealthClient(client).Check(call, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		return header, err
	}
	for i := 0; i < 3; i++ {
		if _, err := check("acme"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	header, err := check("acme")
	after, _ := strconv.Atoi(first(header.Get("retry-after")))
	if status.Code(err) != codes.ResourceExhausted || after < 1 {
		t.Fatalf("refused: %v, retry-after %v", err, header.Get("retry-after"))
	}
	if _, err := check(""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no tenant: %v", err)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
