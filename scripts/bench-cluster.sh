#!/usr/bin/env bash
# Every controller serving: a real etcd, three release controllers on it, one group limited to
# LIMIT units/s, and h2load asking Envoy's rate-limit service (one descriptor, tenant=acme) on
# the leader alone, on one follower alone, then on all three at once. For each run it prints the
# decisions a second, the CPU each controller spent per decision it answered (from /proc), and
# what the leader says the group admitted a second against its limit: a follower decides from
# a lease on the leader, so the three together hold one limit.
# Then clients' exchanges the same three ways: `tollgate bench exchange` (CLIENTS clients of
# GROUPS_PER_CLIENT groups, each exchanging RATE times a second), with the exchanges a second, the
# clients' p50 and p99, and each controller's CPU per exchange it answered (a follower passes
# each on to the leader, whose CPU then counts every exchange; asked nothing, in brackets).
# Usage: scripts/bench-cluster.sh  (builds the release binary with etcd; needs etcd and h2load,
# Debian's etcd-server and nghttp2-client). SECONDS_EACH (10), LIMIT (5000), CLIENTS (1000),
# GROUPS_PER_CLIENT (10) and RATE (2) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_cluster_bench
LIMIT=${LIMIT:-5000}
PIDS=()
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # On a failure, what the controllers logged says why (an election under way, say).
  if [ "$rc" != 0 ]; then for f in "$WORK"/server-*.log; do echo "== $f" >&2; tail -n 20 "$f" >&2; done; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

start_etcd "$WORK"
PIDS+=("$ETCD_PID")

GRPC=() HTTP=() PID=()
for i in 0 1 2; do
  GRPC+=("127.0.0.1:$(free_port)")
  HTTP+=("127.0.0.1:$(free_port)")
  "$BIN" server --etcd "$ETCD_URL" --grpc "${GRPC[$i]}" --http "${HTTP[$i]}" \
    --data "$WORK/data-$i" >"$WORK/server-$i.log" 2>&1 &
  PID+=($!)
  PIDS+=($!)
done
for i in 0 1 2; do wait_for_server "$BIN" "${GRPC[$i]}"; done
"$BIN" group create acme --limit "$LIMIT" --server "http://${GRPC[0]}" >/dev/null

# Which controller leads (the one whose /status says so, once one does).
role() { curl -s "${HTTP[$1]}/status?limit=1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["role"])'; }
leader=
for _ in $(seq 100); do
  for i in 0 1 2; do [ "$(role "$i" 2>/dev/null)" = leader ] && leader=$i; done
  [ -n "$leader" ] && break
  sleep 0.1
done
[ -n "$leader" ] || { echo "no leader" >&2; exit 1; }
followers=()
for i in 0 1 2; do [ "$i" = "$leader" ] || followers+=("$i"); done

write_rls_request "$WORK/rls.bin"

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/${PID[$1]}/stat"; }
admitted_total() {
  curl -s "${HTTP[$leader]}/status" | python3 -c '
import json, sys
print(next((g["admitted_total"] for g in json.load(sys.stdin)["groups"] if g["name"] == "acme"), 0))'
}

# run NAME CONTROLLER...: h2load on each controller named, all at once.
run() {
  local name=$1
  shift
  local before=() i
  for i in 0 1 2; do before+=("$(cpu "$i")"); done
  local from
  from=$(admitted_total)
  local loads=()
  for i in "$@"; do
    h2load -D "$SECONDS_EACH" -c 2 -m 16 -d "$WORK/rls.bin" -H 'content-type: application/grpc' \
      -H 'te: trailers' "http://${GRPC[$i]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      >"$WORK/h2load-$i.txt" 2>&1 &
    loads+=($!)
  done
  wait "${loads[@]}"
  # What the front ends consumed reaches the leader with their next exchanges.
  sleep 2
  local to
  to=$(admitted_total)
  local total=0 calls=() per=()
  for i in 0 1 2; do calls[$i]=0; done
  for i in "$@"; do
    calls[$i]=$(awk '/^requests:/ {print $8}' "$WORK/h2load-$i.txt")
    total=$((total + calls[$i]))
  done
  for i in "$leader" "${followers[@]}"; do
    local spent
    spent=$(($(cpu "$i") - before[$i]))
    if [ "${calls[$i]}" -gt 0 ]; then
      per+=("$(python3 -c "print(f'{$spent / $ticks / ${calls[$i]} * 1e6:.1f}')")")
    else
      per+=("$(python3 -c "print(f'({$spent / $ticks:.2f} s)')")")
    fi
  done
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$((total / SECONDS_EACH))" "${per[0]}" "${per[1]}" "${per[2]}" \
    "$(python3 -c "print(f'{($to - $from) / $SECONDS_EACH:.0f} / $LIMIT')")"
}

# Warm up: each controller's front end holds its lease before anything is measured.
SECONDS_EACH=2 run warm-up "$leader" "${followers[@]}" >/dev/null
echo "| RLS asked of | decisions/s | leader µs CPU/decision | follower | follower | admitted/s at the leader / limit |"
echo "| --- | --- | --- | --- | --- | --- |"
run "the leader alone" "$leader"
run "one follower alone" "${followers[0]}"
run "all three at once" "$leader" "${followers[@]}"
echo "(a controller asked nothing: its CPU seconds over the run, in brackets)"

# exchanges NAME CONTROLLER...: `tollgate bench exchange` over the controllers named.
exchanges() {
  local name=$1
  shift
  local before=() urls=() i
  for i in 0 1 2; do before+=("$(cpu "$i")"); done
  for i in "$@"; do urls+=("http://${GRPC[$i]}"); done
  local out
  out=$("$BIN" bench exchange --server "$(IFS=,; echo "${urls[*]}")" --clients "$CLIENTS" \
    --groups "$GROUPS_EACH" --rate "$RATE" --duration "$SECONDS_EACH" --connections 6 2>&1) ||
    { echo "$out" >&2; exit 1; }
  local per_s p50 p99
  per_s=$(awk '/^exchanges\/s/ {print $2}' <<<"$out")
  p50=$(awk '/^latency/ {print $3}' <<<"$out")
  p99=$(awk '/^latency/ {print $9}' <<<"$out")
  # The connections go to the controllers named in turn: each answers its share.
  local per=() n=$#
  for i in "$leader" "${followers[@]}"; do
    local spent share=0 j
    spent=$(($(cpu "$i") - before[$i]))
    for j in "$@"; do [ "$j" = "$i" ] && share=1; done
    # The leader answers every exchange: its own share directly, the rest passed on to it.
    if [ "$i" = "$leader" ]; then share=$n; fi
    if [ "$share" -gt 0 ]; then
      per+=("$(python3 -c "print(f'{$spent / $ticks / ($per_s * $SECONDS_EACH * $share / $n) * 1e6:.1f}')")")
    else
      per+=("$(python3 -c "print(f'({$spent / $ticks:.2f} s)')")")
    fi
  done
  printf '| %s | %s | %s / %s | %s | %s | %s |\n' "$name" "$per_s" "$p50" "$p99" "${per[0]}" "${per[1]}" "${per[2]}"
}

echo
echo "| exchanges asked of | exchanges/s | p50 / p99 ms | leader µs CPU/exchange | follower | follower |"
echo "| --- | --- | --- | --- | --- | --- |"
exchanges "the leader alone" "$leader"
exchanges "one follower alone" "${followers[0]}"
exchanges "all three at once" "$leader" "${followers[@]}"
echo "(the leader's CPU is per exchange it answered, directly or passed on; a follower's, per exchange it passed on)"
