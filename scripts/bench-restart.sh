#!/usr/bin/env bash
# Over-grant across a restart: 20 remote clients ask a group limited to 1000 units/s for twice
# that, through `tollgate bench accuracy`, while the controller is killed (kill -9) 12 s in and
# started again on the same data 10 s later. Prints the admitted rate against the limit.
# Usage: scripts/bench-restart.sh [path/to/tollgate]  (default: target/release/tollgate)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/tollgate}
DATA=$(mktemp -d)
GRPC=127.0.0.1:7580
HTTP=127.0.0.1:7581
"$BIN" server --data "$DATA" --grpc $GRPC --http $HTTP >/dev/null 2>&1 &
SERVER=$!
sleep 1
"$BIN" bench accuracy --setup --server http://$GRPC --clients 20 --duration 30 --limit 1000 &
BENCH=$!
sleep 12
{ kill -9 $SERVER && wait $SERVER; } 2>/dev/null || true
sleep 10
"$BIN" server --data "$DATA" --grpc $GRPC --http $HTTP >/dev/null 2>&1 &
SERVER=$!
wait $BENCH || true
kill $SERVER
wait $SERVER 2>/dev/null || true
rm -rf "$DATA"
