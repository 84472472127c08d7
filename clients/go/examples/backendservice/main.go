// Command backendservice is a backend that reports to Tollgate: a small HTTP service that
// does work for tenants, tells the controller its load and each tenant's share of it (package
// reporter), and holds each tenant to the soft limit the controller pushes back for this
// backend (backend_limit).
//
// Run it beside a server on 127.0.0.1:7460:
//
//	go run ./examples/backendservice -listen 127.0.0.1:8100 -capacity 1000
//	curl -X POST -H 'X-Tenant: acme' -H 'X-Units: 5' http://127.0.0.1:8100/work
//	curl http://127.0.0.1:8100/limits
//
// POST /work does X-Units units of work (1 by default) for the X-Tenant tenant, or answers
// 429 with Retry-After when that would take the tenant past its soft limit here: a token
// bucket at the limit's rate holding -burst-s seconds of it. GET /limits shows the soft
// limits as last heard. The first line printed is "listening on HOST:PORT".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-rs/tollgate/clients/go/reporter"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves until the process ends.
func run(args []string, out io.Writer) error {
	flags := flag.NewFlagSet("backendservice", flag.ContinueOnError)
	listen := flags.String("listen", "127.0.0.1:8100", "HOST:PORT to serve on (port 0: any free one)")
	server := flags.String("server", "127.0.0.1:7460", "the tollgate server's gRPC address")
	backendID := flags.String("backend-id", "backend-go", "this backend's id")
	zone := flags.String("zone", "zone", "this backend's zone")
	capacity := flags.Float64("capacity", 1000, "units/s this backend can do")
	burstS := flags.Float64("burst-s", 1, "seconds of its soft limit a tenant may use at once")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if !(*burstS > 0) || math.IsInf(*burstS, 0) {
		return fmt.Errorf("-burst-s: must be a number of seconds above 0, got %v", *burstS)
	}
	conn, err := grpc.Dial(*server, grpc.WithInsecure())
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := reporter.New(conn, reporter.Options{BackendID: *backendID, Zone: *zone, Capacity: *capacity})
	if err != nil {
		return err
	}
	go r.Run(context.Background())
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "listening on %s\n", listener.Addr())
	limits := &softLimits{reporter: r, burstS: *burstS, buckets: map[string]*bucket{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/limits", func(w http.ResponseWriter, req *http.Request) {
		answer(w, http.StatusOK, r.SoftLimits())
	})
	mux.HandleFunc("/work", func(w http.ResponseWriter, req *http.Request) {
		work(w, req, r, limits)
	})
	return http.Serve(listener, mux)
}

// work serves POST /work.
func work(w http.ResponseWriter, req *http.Request, r *reporter.Reporter, limits *softLimits) {
	if req.Method != http.MethodPost {
		answer(w, http.StatusMethodNotAllowed, map[string]string{"error": "POST only"})
		return
	}
	tenant, units := req.Header.Get("X-Tenant"), 1.0
	if v := req.Header.Get("X-Units"); v != "" {
		var err error
		if units, err = strconv.ParseFloat(v, 64); err != nil {
			units = -1
		}
	}
	if tenant == "" || !(units > 0) || math.IsInf(units, 0) {
		answer(w, http.StatusBadRequest, map[string]string{"error": "give X-Tenant and X-Units (a number above 0)"})
		return
	}
	if wait := limits.take(tenant, units, time.Now()); wait > 0 {
		retry := "3600"
		if !math.IsInf(wait, 1) {
			retry = strconv.Itoa(int(math.Max(1, math.Ceil(wait))))
		}
		w.Header().Set("Retry-After", retry)
		answer(w, http.StatusTooManyRequests, map[string]string{"error": "over the soft limit", "tenant": tenant})
		return
	}
	r.Record(tenant, units) // the work would be done here
	answer(w, http.StatusOK, map[string]interface{}{"tenant": tenant, "units": units})
}

func answer(w http.ResponseWriter, code int, body interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// softLimits holds each tenant to a bucket at its soft limit: burstS seconds of the rate,
// refilled continuously; tenants without a limit are not held.
type softLimits struct {
	reporter *reporter.Reporter
	burstS   float64
	mu       sync.Mutex
	buckets  map[string]*bucket
}

type bucket struct {
	rate, tokens float64
	at           time.Time
}

// take is 0 when units may be served now (and takes them), else the seconds to wait.
func (s *softLimits) take(tenant string, units float64, now time.Time) float64 {
	rate, ok := s.reporter.SoftLimits()[tenant]
	if !ok {
		return 0
	}
	burst := rate * s.burstS
	if units > burst {
		return math.Inf(1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[tenant]
	if b == nil || b.rate != rate {
		b = &bucket{rate: rate, tokens: burst, at: now}
		s.buckets[tenant] = b
	}
	b.tokens = math.Min(burst, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens >= units {
		b.tokens -= units
		return 0
	}
	return (units - b.tokens) / rate
}
