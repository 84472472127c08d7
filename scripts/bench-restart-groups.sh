#!/usr/bin/env bash
# A restart with many groups stored: writes N groups (a --config of N `[groups.tN]` tables,
# stored at the first start in one write), stops the server, starts it again on the same data
# and prints how long until `/healthz` first answers and until a `POST /v1/check` of a group
# with no traffic before the stop is answered (polled every 10 ms), with `/readyz` meanwhile.
# (`t0`, checked before the stop, is learnt for a lease after it: docs/architecture.md.)
# Usage: scripts/bench-restart-groups.sh N [path/to/tollgate]  (default: target/release/tollgate)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?how many groups}
BIN=${2:-target/release/tollgate}
DATA=$(mktemp -d)
trap 'rm -rf "$DATA"' EXIT
CONFIG="$DATA/groups.toml"
python3 -c "
import sys
with open(sys.argv[1], 'w') as f:
    for i in range(int(sys.argv[2])):
        f.write(f'[groups.t{i}]\nlimit = 100\n')
" "$CONFIG" "$N"
GRPC=127.0.0.1:7590
HTTP=127.0.0.1:7591
now() { date +%s.%N; }
wait_for() { # START PATH METHOD [GROUP]: seconds until it answers 200
  local start=$1 path=$2 method=$3 group=${4:-t0}
  until curl -s -o /dev/null -w '%{http_code}' -X "$method" -H 'content-type: application/json' \
      -d "{\"group\":\"$group\",\"cost\":1}" "http://$HTTP$path" 2>/dev/null | grep -q 200; do
    sleep 0.01
  done
  awk -v a="$(now)" -v b="$start" 'BEGIN { printf "%.3f", a - b }'
}
start=$(now)
"$BIN" server --data "$DATA/store" --grpc $GRPC --http $HTTP --config "$CONFIG" >/dev/null 2>&1 &
SERVER=$!
echo "stored $N groups in $(wait_for "$start" /v1/check POST) s"
kill $SERVER; wait $SERVER 2>/dev/null || true
start=$(now)
"$BIN" server --data "$DATA/store" --grpc $GRPC --http $HTTP >/dev/null 2>&1 &
SERVER=$!
health=$(wait_for "$start" /healthz GET)
loading=$(curl -s "http://$HTTP/readyz" || true)
first=$(wait_for "$start" /v1/check POST t1)
echo "restart with $N groups: /healthz after $health s (readyz: ${loading%%$'\n'*}), first check answered after $first s"
kill $SERVER; wait $SERVER 2>/dev/null || true
