#!/usr/bin/env bash
# Every speed figure of BENCHMARKS.md's goals, measured on this machine in one go, each beside
# its peer from the same run: the handle and admission by name beside governor (alternating
# rounds), the controller's group grants a second, its p99 at half a million grants a second,
# throttled clients' exchanges, and the tick at 100,000 groups.
# Usage: scripts/bench-figures.sh [--criterion] [--surge]
#   --criterion  also the criterion peers bench (governor, limitador; about 3 minutes)
#   --surge      also scripts/bench-surge.sh (a surge against examples/kv-service; about 1 minute)
# Takes about 2 minutes without them, 5 with both, on 2 cores. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
CRITERION=0
SURGE=0
for a in "$@"; do
  case "$a" in
    --criterion) CRITERION=1 ;;
    --surge) SURGE=1 ;;
    *) echo "unknown argument: $a (expected --criterion or --surge)" >&2; exit 2 ;;
  esac
done
field() { awk -F: -v k="$1" '{ sub(/[ \t]+$/, "", $1) } $1 == k { sub(/^ /, "", $2); print $2; exit }' /proc/cpuinfo; }
echo "== this machine: $(field 'model name'), family $(field 'cpu family') model $(field model), $(nproc) cores"
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

echo "== 1. a group's handle at 10,000 and 100,000 units/s, beside governor's check_n"
"$PEERS/rate_rounds" 10000 5 | tail -1
"$PEERS/rate_rounds" 100000 5 | tail -1

echo "== 2. admission by name, beside governor's keyed check_key_n"
"$PEERS/by_name_rounds" 1 5
"$PEERS/by_name_rounds" 1000 5
"$PEERS/by_name_rounds" 1000 5 shuffled
"$PEERS/by_name_rounds" 10000 5 shuffled
"$PEERS/by_name_rounds" 100000 5
"$PEERS/by_name_rounds" 100000 5 shuffled

echo "== 4. the controller: 1,000 clients × 100 groups, as fast as it answers"
start_server
load() { "$BIN" bench exchange --server "http://$GRPC" --clients 1000 --groups 100 "$@"; }
load --duration 3 --rate 5 >/dev/null
load --duration 10 --rate 0 --server-pid "$SERVER" | grep -E "grants/s|CPU"
echo "== 4. p99 at half the goal's load (500,000 group grants a second), three runs"
for _ in 1 2 3; do
  start_server
  load --duration 3 --rate 5 >/dev/null
  load --duration 10 --rate 5 --server-pid "$SERVER" --server-http "$HTTP" | grep -E "latency|CPU"
done

echo "== 4. 10,000 throttled clients' exchanges"
start_server
"$BIN" bench accuracy --server "http://$GRPC" --clients 10000 --limit 100000 --duration 10 --server-http "$HTTP" \
  | grep -E "asked 2×|exchanges/s"
stop_server

echo "== 4, 5. memory per (client, group) pair and the tick at 100,000 groups, 10,000 clients"
cargo bench -q -p tollgate-core --bench scale -- --bench 2>/dev/null | grep -E "groups|tick|memory"

if [ "$SURGE" = 1 ]; then
  echo "== 6. a surge to 1.6× a real service"
  scripts/bench-surge.sh
fi

if [ "$CRITERION" = 1 ]; then
  echo "== 1, 2, 3. criterion: the handle and by name beside governor and limitador"
  cargo bench --manifest-path benches/peers/Cargo.toml 2>/dev/null \
    | awk '/^(rate|by_name)/ { name = $1 } /time:/ { print name, $0 }' | sed 's/  */ /g'
fi
