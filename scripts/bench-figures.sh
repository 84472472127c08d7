#!/usr/bin/env bash
# Every speed figure of BENCHMARKS.md's goals, measured on this machine in one go, each beside
# its peer from the same run: the handle (at the goal's two rates and three others) and
# admission by name beside governor (alternating rounds), the controller's group grants a
# second (1,000 clients, and the fleet's 10,000), its p99 at half a million grants a second
# (also with ten backends reporting), throttled clients' exchanges, and the tick at 100,000
# groups; then the serving paths straight to Tollgate (RLS decisions, HTTP checks and charges,
# with h2load when it is installed: Debian's nghttp2-client).
# Usage: scripts/bench-figures.sh [--criterion] [--surge] [--envoy PATH]
#   --criterion  also the criterion peers bench (governor, limitador; about 3 minutes)
#   --surge      also scripts/bench-surge.sh (a surge against examples/kv-service; about 1 minute)
#   --envoy PATH also Envoy with RLS and with RLQS beside Envoy alone (about 1 minute)
# Takes about 5 minutes without them, 11 with all, on 2 cores. Run it on a quiet machine.
# Ends with each figure against its goal, "met" or "NOT MET".
set -euo pipefail
cd "$(dirname "$0")/.."
CRITERION=0
SURGE=0
ENVOY=none
while [ $# -gt 0 ]; do
  case "$1" in
    --criterion) CRITERION=1 ;;
    --surge) SURGE=1 ;;
    --envoy)
      [ $# -ge 2 ] || { echo "--envoy needs the path of an Envoy binary" >&2; exit 2; }
      ENVOY=$2
      shift
      ;;
    *) echo "unknown argument: $1 (expected --criterion, --surge or --envoy PATH)" >&2; exit 2 ;;
  esac
  shift
done
field() { awk -F: -v k="$1" '{ sub(/[ \t]+$/, "", $1) } $1 == k { sub(/^ /, "", $2); print $2; exit }' /proc/cpuinfo; }
echo "== this machine: $(field 'model name'), family $(field 'cpu family') model $(field model), $(nproc) cores"
# How busy the machine is before anything of ours runs, in per cent of all its cores over a
# second (from /proc/stat): the p99 goal needs both cores, and a process left running on one
# (a forgotten loop, a build) fails it for any build.
busy_percent() {
  local a b
  read -r -a a < <(head -1 /proc/stat)
  sleep 1
  read -r -a b < <(head -1 /proc/stat)
  awk -v a="${a[*]}" -v b="${b[*]}" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); total = 0
    # user to steal; guest time is counted in user already
    for (i = 2; i <= 9 && i <= n; i++) total += y[i] - x[i]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    printf "%.0f", (total > 0) ? 100 * (total - idle) / total : 0
  }'
}
BUSY_BEFORE=$(busy_percent)
QUIET_NOTE=""
if [ "$BUSY_BEFORE" -ge 10 ]; then
  QUIET_NOTE="the machine was ${BUSY_BEFORE} % busy before the run (something else is running): the figures, the p99 most, are not this build's alone"
  echo "== WARNING: $QUIET_NOTE"
else
  echo "== the machine was ${BUSY_BEFORE} % busy before the run"
fi
cargo build --release -q -p tollgate-cli
cargo build --release -q --manifest-path benches/peers/Cargo.toml --examples
BIN=target/release/tollgate
PEERS=benches/peers/target/release/examples
DATA=$(mktemp -d)
. scripts/lib.sh
SERVER=
stop_server() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  SERVER=
}
cleanup() {
  stop_server
  rm -rf "$DATA"
}
trap cleanup EXIT
# A fresh controller on the embedded store: sets GRPC and HTTP.
start_server() {
  stop_server
  rm -rf "$DATA/store"
  GRPC=127.0.0.1:$(free_port)
  HTTP=127.0.0.1:$(free_port)
  "$BIN" server --data "$DATA/store" --grpc "$GRPC" --http "$HTTP" >"$DATA/server.log" 2>&1 &
  SERVER=$!
  wait_for_server "$BIN" "$GRPC" && return
  echo "the server did not start:" >&2
  cat "$DATA/server.log" >&2
  exit 1
}

# The figures against their goals, printed at the end.
VERDICTS="$DATA/verdicts"
: >"$VERDICTS"
# verdict WHAT VALUE OP GOAL: records whether VALUE OP GOAL holds (OP is <=, < or >=); a value
# that could not be read is NOT MET.
verdict() {
  awk -v what="$1" -v v="$2" -v op="$3" -v goal="$4" 'BEGIN {
    x = v + 0; g = goal + 0
    ok = (v != "") && ((op == "<=") ? (x <= g) : (op == "<") ? (x < g) : (x >= g))
    printf "%-58s %12s  goal %s %-9s %s\n", what, (v == "" ? "?" : v), op, goal, (ok ? "met" : "NOT MET")
  }' >>"$VERDICTS"
}
# The number after WORD in LINE.
after() { awk -v w="$1" '{ for (i = 1; i < NF; i++) if ($i == w) { v = $(i + 1) } } END { sub(/[^0-9.]+$/, "", v); print v }' <<<"$2"; }

echo "== 1. a group's handle at 10,000 and 100,000 units/s, beside governor's check_n"
for rate in 10000 100000; do
  line=$("$PEERS/rate_rounds" "$rate" 5 | tail -1)
  echo "$line"
  verdict "1. handle at $rate units/s, × governor" "$(after ratio "$line")" "<=" 0.8
done
echo "== 1. the same at other rates (fastest at every rate: no slower than governor)"
for rate in 1000 1000000 10000000; do
  line=$("$PEERS/rate_rounds" "$rate" 5 | tail -1)
  echo "$line"
  verdict "1. handle at $rate units/s, × governor" "$(after ratio "$line")" "<=" 1
done

echo "== 2. admission by name, beside governor's keyed check_key_n"
for keys in "1" "1000" "1000 shuffled" "10000 shuffled" "100000" "100000 shuffled" "1 rate=1000000" "1000 rate=1000000"; do
  # shellcheck disable=SC2086 # the keys, the order or the rate, as up to two arguments
  set -- $keys
  line=$("$PEERS/by_name_rounds" "$1" 5 ${2:-})
  echo "$line"
  verdict "2. by name, $keys keys, × governor" "$(after ratio "$line")" "<=" 1
done

# full_speed CLIENTS RATE WHAT: a fresh controller, a warm-up of 5 s at RATE exchanges a client
# a second (which makes the clients and their groups), then 10 s with CLIENTS clients of 100
# groups each exchanging as fast as it answers; WHAT names the figure against the goal.
full_speed() {
  start_server
  "$BIN" bench exchange --server "http://$GRPC" --clients "$1" --groups 100 --duration 5 --rate "$2" >/dev/null
  out=$("$BIN" bench exchange --server "http://$GRPC" --clients "$1" --groups 100 --duration 10 --rate 0 \
    --server-pid "$SERVER" | grep -E "grants/s|CPU")
  echo "$out"
  verdict "$3" "$(after grants/s "$out")" ">=" 1000000
}
echo "== 4. the controller: 1,000 clients × 100 groups, as fast as it answers"
full_speed 1000 5 "4. controller, group grants a second"
echo "== 4. the controller at the fleet's shape: 10,000 clients × 100 groups (1,000,000 pairs)"
full_speed 10000 1 "4. controller, 10,000 clients × 100 groups, grants a second"
load() { "$BIN" bench exchange --server "http://$GRPC" --clients 1000 --groups 100 "$@"; }
echo "== 4. p99 at half the goal's load (500,000 group grants a second), three runs"
for run in 1 2 3; do
  start_server
  load --duration 3 --rate 5 >/dev/null
  out=$(load --duration 10 --rate 5 --server-pid "$SERVER" --server-http "$HTTP" | grep -E "latency|own answer|CPU")
  echo "$out"
  # The server's CPU beside it: on a shared 2-core machine the p99 follows it.
  cpu=$(after CPU "$(grep "server CPU" <<<"$out")")
  verdict "4. p99 at 500,000 grants/s, run $run (server ${cpu:-?} %), ms" "$(after p99 "$(grep "^latency" <<<"$out")")" "<=" 1
done
echo "== 4. p99 at half the goal's load with ten saturated backends reporting 10,000 groups each, two runs"
for run in 1 2; do
  start_server
  load --duration 3 --rate 5 --backends 10 >/dev/null
  out=$(load --duration 10 --rate 5 --backends 10 --server-pid "$SERVER" --server-http "$HTTP" \
    | grep -E "latency|own answer|CPU|backends")
  echo "$out"
  cpu=$(after CPU "$(grep "server CPU" <<<"$out")")
  verdict "4. p99, 10 backends, run $run (server ${cpu:-?} %), ms" "$(after p99 "$(grep "^latency" <<<"$out")")" "<=" 1
done

echo "== 4. 10,000 throttled clients' exchanges"
start_server
out=$("$BIN" bench accuracy --setup --server "http://$GRPC" --clients 10000 --limit 100000 --duration 10 --server-http "$HTTP" \
  | grep -E "asked 2×|exchanges/s")
echo "$out"
# One exchange a client per tick (a second), and the few per cent more of a client whose
# share's burst fell below one request.
verdict "4. exchanges a throttled client a second" "$(sed -n 's/.*, \([0-9.]*\) a client a second.*/\1/p' <<<"$out")" "<=" 1.05
stop_server

echo "== 4, 5. memory per (client, group) pair and the tick at 100,000 groups, 10,000 clients"
out=$(cargo bench -q -p tollgate-model --bench scale -- --bench 2>/dev/null | grep -E "groups|tick|memory")
echo "$out"
verdict "5. tick, 10,000 clients × 10 groups, median ms" "$(grep -m1 "tick:" <<<"$out" | awk '{ print $3 }')" "<=" 50
verdict "5. tick, 10,000 clients × 100 groups, median ms" "$(grep "tick:" <<<"$out" | sed -n 2p | awk '{ print $3 }')" "<=" 50
verdict "4. memory a pair at the fleet's shape (× 100), bytes" "$(grep "per client-group pair:" <<<"$out" | sed -n 2p | awk '{ print $5 }')" "<=" 256

echo "== 7. the serving paths straight to Tollgate$([ "$ENVOY" != none ] && echo ", and Envoy in front of one upstream")"
if command -v h2load >/dev/null; then
  out=$(SECONDS_EACH=8 scripts/bench-envoy.sh "$BIN" "$ENVOY")
  echo "$out"
  # The calls a second of the row starting with NAME (the table's second column).
  rate_of() { awk -F'|' -v n="$1" 'index($2, " " n) == 1 { gsub(/ /, "", $3); print $3; exit }' <<<"$out"; }
  verdict "7. RLS decisions a second (4 × 32)" "$(rate_of "RLS decision")" ">=" 150000
  verdict "7. POST /v1/check a second, HTTP/2 (4 × 32)" "$(rate_of "POST /v1/check, HTTP/2")" ">=" 100000
  verdict "7. POST /v1/charge a second, HTTP/2 (4 × 32)" "$(rate_of "POST /v1/charge, HTTP/2")" ">=" 100000
  verdict "7. POST /v1/check a second, HTTP/1.1 (64 connections)" "$(rate_of "POST /v1/check, HTTP/1.1")" ">=" 100000
  if [ "$ENVOY" != none ]; then
    alone=$(rate_of "no limiter")
    ratio() { awk -v a="$1" -v b="$alone" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b }'; }
    verdict "7. Envoy with Tollgate's RLS, × Envoy alone" "$(ratio "$(rate_of "Tollgate RLS")")" ">=" 0.6
    verdict "7. Envoy with Tollgate's RLQS, × Envoy alone" "$(ratio "$(rate_of "Tollgate RLQS")")" ">=" 0.92
  fi
else
  echo "(no h2load: install Debian's nghttp2-client for these figures)"
  verdict "7. RLS decisions a second (no h2load)" "" ">=" 150000
fi

if [ "$SURGE" = 1 ]; then
  echo "== 6. a surge to 1.6× a real service"
  out=$(scripts/bench-surge.sh)
  echo "$out"
  verdict "6. surge: bronze marked busy after, s" "$(grep "marked busy" <<<"$out" | awk '{ print $4 }')" "<=" 2
  verdict "6. surge: peak utilisation" "$(grep "peak utilisation" <<<"$out" | awk '{ print $3 }')" "<" 1.3
  verdict "6. surge: within 5 % of 1 from, s" "$(grep "within 5 %" <<<"$out" | awk '{ print $7 }')" "<=" 5
fi

if [ "$CRITERION" = 1 ]; then
  echo "== 1, 2, 3. criterion: the handle and by name beside governor and limitador"
  out=$(cargo bench --manifest-path benches/peers/Cargo.toml 2>/dev/null \
    | awk '/^(rate|by_name)/ { name = $1 } /time:/ { print name, $0 }' | sed 's/  */ /g')
  echo "$out"
  # The median of a case, in ns.
  median() {
    grep -F "$1 " <<<"$out" | awk '{ v = $5; if ($6 == "µs") v *= 1000; if ($6 == "ms") v *= 1e6; print v }'
  }
  for c in rate_10k rate_100k rate_1000k; do
    goal=0.8
    [ "$c" = rate_1000k ] && goal=1
    verdict "1. criterion $c, × governor" "$(awk -v a="$(median "$c/tollgate_group_handle")" -v b="$(median "$c/governor_check_n")" 'BEGIN { if (a != "" && b != "") printf "%.2f", a / b }')" "<=" "$goal"
  done
  for c in by_name_1 by_name_1000 by_name_10000 by_name_100000; do
    verdict "2. criterion $c, × governor" "$(awk -v a="$(median "$c/tollgate_by_name")" -v b="$(median "$c/governor_check_key_n")" 'BEGIN { if (a != "" && b != "") printf "%.2f", a / b }')" "<=" 1
  done
fi

echo "== the figures against their goals ($(field 'model name'), family $(field 'cpu family') model $(field model))"
cat "$VERDICTS"
if [ -n "$QUIET_NOTE" ]; then
  echo "WARNING: $QUIET_NOTE"
fi
