#!/usr/bin/env bash
# Envoy in front of one upstream, four ways, by h2load: no limiter, Envoy's own local rate limit
# (per Envoy, not shared), Tollgate's rate-limit service (RLS: a call per request), and
# Tollgate's quota service (RLQS: no call per request). Then calls a second straight to
# Tollgate: RLS decisions and charges over gRPC, and `POST /v1/check` and `/v1/charge` over
# HTTP/2 and HTTP/1.1 keep-alive connections, each with the server's CPU a call.
# The group is limited far above the load, so every request is admitted and what is measured is
# the cost of deciding. Usage: scripts/bench-envoy.sh [path/to/tollgate] [path/to/envoy | none]
# (defaults: target/release/tollgate, envoy on PATH; `none` measures the calls straight to
# Tollgate alone). Needs h2load (Debian's nghttp2-client).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=${1:-target/release/tollgate}
ENVOY=${2:-envoy}
SECONDS_EACH=${SECONDS_EACH:-10}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

GRPC=127.0.0.1:$(free_port)
HTTP=127.0.0.1:$(free_port)
"$BIN" server --data "$WORK/data" --grpc "$GRPC" --http "$HTTP" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
PIDS+=($!)
wait_for_server "$BIN" "$GRPC"
"$BIN" group create acme --limit 1000000000 --server "http://$GRPC" >/dev/null

if [ "$ENVOY" != none ]; then
# The upstream: an Envoy answering 200 itself.
UP=$(free_port)
cat >"$WORK/upstream.yaml" <<EOF
static_resources:
  listeners:
  - address: { socket_address: { address: 127.0.0.1, port_value: $UP } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: upstream
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "ok" } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
EOF
"$ENVOY" -c "$WORK/upstream.yaml" --concurrency 1 --disable-hot-restart --base-id "$UP" --log-level error &
PIDS+=($!)

# The shipped configuration $1 on our ports, with sed expression $2 applied.
config() {
  local listen=$3 admin=$4
  sed -e "s/port_value: 10000 /port_value: $listen /; s/port_value: 9901 /port_value: $admin /" \
    -e "s/port_value: 7460 /port_value: ${GRPC##*:} /; s/port_value: 8080 /port_value: $UP /" \
    -e "$2" "examples/envoy/$1"
}

# Each variant gets its own ports through the files written here.
variant() {
  local name=$1 src=$2 expr=$3 listen admin
  listen=$(free_port)
  admin=$(free_port)
  config "$src" "$expr" "$listen" "$admin" >"$WORK/$name.yaml"
  run_at "$name" "$WORK/$name.yaml" "$listen" "$admin"
}

run_at() {
  local name=$1 file=$2 listen=$3 admin=$4 envoy
  "$ENVOY" -c "$file" --concurrency 1 --disable-hot-restart --base-id "$listen" --log-level error &
  envoy=$!
  for _ in $(seq 100); do curl -sf "127.0.0.1:$admin/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  h2load -D 2 -c 16 -m 8 -H 'x-tenant: acme' "http://127.0.0.1:$listen/" >/dev/null 2>&1 || true
  h2load -D "$SECONDS_EACH" -c 16 -m 8 -H 'x-tenant: acme' "http://127.0.0.1:$listen/" >"$WORK/h2load.txt" 2>&1
  kill "$envoy" 2>/dev/null || true
  wait "$envoy" 2>/dev/null || true
  local rps mean codes
  rps=$(awk '/^finished in/ {print $4}' "$WORK/h2load.txt")
  mean=$(awk '/^time for request:/ {print $6}' "$WORK/h2load.txt")
  codes=$(awk '/^status codes:/ {print $3 " 2xx, " $7 " 4xx"}' "$WORK/h2load.txt")
  printf '| %s | %s | %s | %s |\n' "$name" "$rps" "$mean" "$codes"
}

echo "| Envoy (one worker) in front of one upstream | requests/s | mean latency | answers |"
echo "| --- | --- | --- | --- |"
# No limiter: the RLS file without its rate-limit filter.
variant "no limiter" envoy.yaml '/- name: envoy.filters.http.ratelimit/,/envoy_grpc: { cluster_name: tollgate }/d'
# Envoy's own local rate limit, per Envoy (the peer that needs no service), sized far above the load.
variant "local rate limit (peer)" envoy.yaml '/- name: envoy.filters.http.ratelimit/,/envoy_grpc: { cluster_name: tollgate }/c\
          - name: envoy.filters.http.local_ratelimit\
            typed_config:\
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit\
              stat_prefix: local\
              token_bucket: { max_tokens: 100000000, tokens_per_fill: 100000000, fill_interval: 1s }\
              filter_enabled: { default_value: { numerator: 100 }, runtime_key: local_enabled }\
              filter_enforced: { default_value: { numerator: 100 }, runtime_key: local_enforced }'
variant "Tollgate RLS (a call per request)" envoy.yaml ''
variant "Tollgate RLQS (no call per request)" rlqs.yaml ''

fi

# RLS straight to Tollgate: one descriptor tenant=acme, gRPC-framed, over h2.
python3 - "$WORK/rls.bin" "$WORK/charge.bin" <<'EOF'
import sys
def field(n, payload): return bytes([n << 3 | 2]) + bytes([len(payload)]) + payload
def entry(k, v): return field(1, field(1, k.encode()) + field(2, v.encode()))
def request(*entries):
    msg = field(1, b"edge") + field(2, b"".join(entries))
    return b"\0" + len(msg).to_bytes(4, "big") + msg
open(sys.argv[1], "wb").write(request(entry("tenant", "acme")))
# A charge of 1 unit: the charge entry beside the tenant.
open(sys.argv[2], "wb").write(request(entry("tenant", "acme"), entry("tollgate_charge", "after")))
EOF
# The server's CPU so far, in clock ticks (user and system).
server_ticks() { awk '{ print $14 + $15 }' "/proc/$SERVER_PID/stat"; }
# row NAME: the row of the h2load run just made, with the server's CPU a call since $TICKS.
row() {
  local calls rate ticks
  calls=$(awk '/^requests:/ {print $8}' "$WORK/h2load.txt")
  rate=$(awk '/^finished in/ {print $4}' "$WORK/h2load.txt")
  ticks=$(($(server_ticks) - TICKS))
  printf '| %s | %s | %s | %s |\n' "$1" "$rate" "$(awk '/^time for request:/ {print $6}' "$WORK/h2load.txt")" \
    "$(awk -v t="$ticks" -v n="${calls:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n }')"
}
grpc_load() {
  TICKS=$(server_ticks)
  h2load -D "$SECONDS_EACH" -c 4 -m 32 -d "$1" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://$GRPC/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >"$WORK/h2load.txt" 2>&1
  row "$2"
}
# http_load PATH BODY NAME H2LOAD-ARGS...: POST BODY to PATH on the HTTP port.
http_load() {
  local path=$1 body=$2 name=$3
  shift 3
  printf '%s\n' "$body" >"$WORK/body.json"
  TICKS=$(server_ticks)
  h2load "$@" -D "$SECONDS_EACH" -d "$WORK/body.json" -H 'content-type: application/json' \
    "http://$HTTP$path" >"$WORK/h2load.txt" 2>&1 || true
  row "$name"
}
echo
echo "| straight to Tollgate (h2load) | calls/s | mean latency | server CPU a call, µs |"
echo "| --- | --- | --- | --- |"
grpc_load "$WORK/rls.bin" "RLS decision (4 connections × 32 streams)"
grpc_load "$WORK/charge.bin" "RLS charge, tollgate_charge (4 × 32)"
http_load /v1/check '{"group":"acme","cost":1}' "POST /v1/check, HTTP/2 (4 × 32)" -c 4 -m 32
http_load /v1/charge '{"group":"acme","units":1}' "POST /v1/charge, HTTP/2 (4 × 32)" -c 4 -m 32
http_load /v1/check '{"group":"acme","cost":1}' "POST /v1/check, HTTP/1.1 keep-alive (64 connections)" --h1 -c 64 -m 1
http_load /v1/charge '{"group":"acme","units":1}' "POST /v1/charge, HTTP/1.1 keep-alive (64 connections)" --h1 -c 64 -m 1
