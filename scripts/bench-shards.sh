#!/usr/bin/env bash
# Groups sharded over three controllers: a real etcd with a short election (its shortest lease
# 1 s), three release controllers with --shards 256 --election-lease-s 1.
# 1. Clients' exchanges spread over all three: `tollgate bench exchange` (CLIENTS clients of
#    GROUPS_PER_CLIENT groups each, RATE exchanges a second), with the exchanges a second, the
#    clients' p50 and p99, and each controller's CPU per exchange (a third of them each): once
#    with each exchange asked of one controller, which answers its own groups' parts and passes
#    the others on to their owners; once with `--route`, each part sent to its owner.
# 2. Envoy's rate-limit service asked on all three with h2load (a group limited to 5,000/s):
#    the decisions a second, and each controller's CPU per decision (the group's owner, and the
#    others, which decide from a lease on it).
# 3. Failover: RUNS times, kill -9 one controller (each in turn, the leader among them), time
#    until the two left own every shard, then start it again and time until the map gives it
#    shards again (the rebalance). Prints each run and the median and worst.
# Usage: scripts/bench-shards.sh  (builds the release binary with etcd; needs Debian's
# etcd-server). SECONDS_EACH (10), CLIENTS (1000), GROUPS_PER_CLIENT (10), RATE (2) and RUNS
# (10) may be set. Needs h2load (Debian's nghttp2-client).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_cluster_bench
RUNS=${RUNS:-10}
PID=()
ETCD_PID=
cleanup() {
  for p in "${PID[@]}" $ETCD_PID; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start_etcd "$WORK" --heartbeat-interval 50 --election-timeout 500

start() { start_controller "$1" --shards 256 --election-lease-s 1; }
start_three
owned() { curl -s "${HTTP[$1]}/metrics" 2>/dev/null | awk '/^tollgate_shards_owned / {print $2}'; }
all_owned() {
  local total=0 i n
  for i in "$@"; do n=$(owned "$i"); total=$((total + ${n:-0})); done
  [ "$total" = 256 ]
}
epoch() { curl -s "${HTTP[$1]}/metrics" 2>/dev/null | awk '/^tollgate_shard_map_epoch / {print $2}'; }
# Settled: every shard owned, each controller some, and all three on the same map.
settled() {
  local i n
  for i in 0 1 2; do n=$(owned "$i"); [ "${n:-0}" -gt 0 ] || return 1; done
  all_owned 0 1 2 && [ "$(epoch 0)" = "$(epoch 1)" ] && [ "$(epoch 1)" = "$(epoch 2)" ]
}
until_true settled

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/${PID[$1]}/stat"; }
before=()
# The exchange load twice: each exchange to one controller, which passes the other owners'
# parts on; then with --route, each part to its owner, as clients holding the map send them.
exchange_load() {
  local before=() i spent out
  for i in 0 1 2; do before+=("$(cpu "$i")"); done
  out=$("$BIN" bench exchange --server "http://${GRPC[0]},http://${GRPC[1]},http://${GRPC[2]}" \
    --clients "$CLIENTS" --groups "$GROUPS_EACH" --rate "$RATE" --duration "$SECONDS_EACH" --connections 6 "$@" 2>&1) ||
    { echo "$out" >&2; for i in 0 1 2; do curl -s "${HTTP[$i]}/metrics" | grep -E "^tollgate_shard" >&2; tail -3 "$WORK/server-$i.log" >&2; done; exit 1; }
  per_s=$(awk '/^exchanges\/s/ {print $2}' <<<"$out")
  p50=$(awk '/^latency/ {print $3}' <<<"$out")
  p99=$(awk '/^latency/ {print $9}' <<<"$out")
  per=()
  for i in 0 1 2; do
    spent=$(($(cpu "$i") - before[$i]))
    per+=("$(python3 -c "print(f'{$spent / $ticks / ($per_s * $SECONDS_EACH / 3) * 1e6:.1f}')")")
  done
}
# What each controller spends with no load (its leases, the map, the claims, its tick).
idle=()
for i in 0 1 2; do before[$i]=$(cpu "$i"); done
sleep "$SECONDS_EACH"
for i in 0 1 2; do
  idle+=("$(python3 -c "print(f'{($(cpu "$i") - ${before[$i]}) / $ticks / $SECONDS_EACH * 1e3:.1f}')")")
done
echo "idle: ${idle[0]}, ${idle[1]}, ${idle[2]} ms CPU a second, each controller"
echo "| exchanges | exchanges/s | p50 / p99 ms | µs CPU per exchange (its share), each controller |"
echo "| --- | --- | --- | --- |"
exchange_load
echo "| each to one controller, split there | $per_s | $p50 / $p99 | ${per[0]}, ${per[1]}, ${per[2]} |"
exchange_load --route
echo "| each part to its owner (--route) | $per_s | $p50 / $p99 | ${per[0]}, ${per[1]}, ${per[2]} |"

# Envoy's rate-limit service asked on all three at once, one group limited to 5,000/s: the
# group's owner decides from its engine, the other two from leases on it.
"$BIN" group create acme --limit 5000 --server "http://${GRPC[0]}" >/dev/null
write_rls_request "$WORK/rls.bin"
rls_all() {
  local loads=() i
  for i in 0 1 2; do
    h2load -D "$1" -c 2 -m 16 -d "$WORK/rls.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://${GRPC[$i]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >"$WORK/h2load-$i.txt" 2>&1 &
    loads+=($!)
  done
  wait "${loads[@]}"
}
rls_all 2
owner=
for i in 0 1 2; do curl -s "${HTTP[$i]}/status" | grep -q '"name":"acme"' && owner=$i; done
before=()
for i in 0 1 2; do before+=("$(cpu "$i")"); done
rls_all "$SECONDS_EACH"
total=0 per=()
for i in 0 1 2; do
  calls=$(awk '/^requests:/ {print $8}' "$WORK/h2load-$i.txt")
  total=$((total + calls))
  spent=$(($(cpu "$i") - before[$i]))
  role=$([ "$i" = "$owner" ] && echo owner || echo other)
  per+=("$role $(python3 -c "print(f'{$spent / $ticks / $calls * 1e6:.1f}')")")
done
echo
echo "| RLS asked of | decisions/s | µs CPU per decision, each controller |"
echo "| --- | --- | --- |"
echo "| all three, 256 shards | $((total / SECONDS_EACH)) | ${per[0]}, ${per[1]}, ${per[2]} |"

echo
echo "| run | killed | its shards owned by the two left after | given shards again after its restart |"
echo "| --- | --- | --- | --- |"
moves=() rebalances=()
for run in $(seq "$RUNS"); do
  k=$(( (run - 1) % 3 ))
  others=()
  for i in 0 1 2; do [ "$i" = "$k" ] || others+=("$i"); done
  until_true settled
  sleep 1
  from=$(ms)
  kill -9 "${PID[$k]}"
  wait "${PID[$k]}" 2>/dev/null || true
  until_true all_owned "${others[@]}"
  moved=$(( $(ms) - from ))
  from=$(ms)
  start "$k"
  gets_shards() { local n; n=$(owned "$k"); [ "${n:-0}" -gt 0 ] && all_owned 0 1 2; }
  until_true gets_shards
  rebalanced=$(( $(ms) - from ))
  moves+=("$moved") rebalances+=("$rebalanced")
  echo "| $run | $k | $moved ms | $rebalanced ms |"
done
python3 - "${moves[*]}" "${rebalances[*]}" <<'PY'
import statistics, sys
moves = [int(x) for x in sys.argv[1].split()]
back = [int(x) for x in sys.argv[2].split()]
print(f"killed: median {statistics.median(moves):.0f} ms, worst {max(moves)} ms; "
      f"restarted (process start included): median {statistics.median(back):.0f} ms, worst {max(back)} ms")
PY
