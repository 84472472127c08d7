#!/usr/bin/env bash
# Overload held on a real service that configures no capacity: a controller and
# examples/kv-service doing real work (--work cpu, so what it can do is this machine's), then
# `tollgate bench capacity` for each arm in turn, on a fresh controller and service each:
# no limiter, a static token bucket at the service's best, and the limit learned from latency.
# The learned arm's clients also throttle themselves when it sheds. Prints, for each arm, the goodput, the p99 of admitted requests and the critical requests'
# success at 1, 2, 4 and 8 times the best, and after the service slows to half its speed.
# Usage: scripts/bench-capacity.sh [extra `bench capacity` options]  (builds the release
# binaries; ROUNDS=n sets the service's work per request, 2000 hashing passes by default)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_service_bench
ROUNDS=${ROUNDS:-2000}
# 512 at once is no limit at all for this service. A request waits at most 5 ms for its
# group's grant: a longer wait would count against the p99.
SERVICE_OPTS=(--work cpu --rounds "$ROUNDS" --concurrency 512 --admit-wait 5)
best=
for arm in none static learned; do
  learn=() throttle=()
  # The learned arm is Tollgate's whole answer: the service learns, its clients throttle.
  [ "$arm" = learned ] && learn=(--learn) throttle=(--client-throttle)
  start_server_and_service "${SERVICE_OPTS[@]}" "${learn[@]}"
  out=$("$BIN" bench capacity --server "http://$GRPC" --service "$SERVICE" --arm "$arm" \
    ${best:+--best "$best"} "${throttle[@]}" "$@")
  echo "$out"
  # Every arm is measured against the best the first one measured.
  [ -n "$best" ] || best=$(echo "$out" | sed -n 's/^arm .*: best \([0-9]*\) values.*/\1/p')
  stop_server_and_service
done
