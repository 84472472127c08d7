#!/usr/bin/env bash
# Failover at the defaults: a stock etcd (its default heartbeat and election timeout) and three
# release controllers started with no tuning, RUNS times kill -9 one of them and time until
# the two left serve again: one of them leads and both name it, and with SHARDS set the two
# own every shard. Unsharded, the leader is killed each run; sharded, each controller in
# turn (the leader among them). The killed one is started again before the next run. Prints
# each run, then the median and the worst.
# Usage: scripts/bench-failover.sh  (builds the release binary with etcd; needs Debian's
# etcd-server). RUNS (20) and SHARDS (none; 256, say) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_cluster_bench
RUNS=${RUNS:-20}
SHARDS=${SHARDS:-}
PID=()
ETCD_PID=
trap stop_cluster_bench EXIT

start_etcd "$WORK"

start() {
  local more=()
  [ -z "$SHARDS" ] || more=(--shards "$SHARDS")
  start_controller "$1" "${more[@]}"
}
start_three
status() { curl -s --max-time 1 "${HTTP[$1]}/status" 2>/dev/null || true; }
# A top-level string field of /status ("role", "leader"); the first of its name is the node's.
field() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
owned() { curl -s --max-time 1 "${HTTP[$1]}/metrics" 2>/dev/null | awk '/^tollgate_shards_owned / {print $2}'; }
# The controllers given serve: one leads, every one names it, and with shards they own all.
serving() {
  local leaders=0 named=() i s total=0 n
  for i in "$@"; do
    s=$(status "$i")
    [ -n "$s" ] || return 1
    [ "$(field role <<<"$s")" = leader ] && leaders=$((leaders + 1))
    named+=("$(field leader <<<"$s")")
  done
  [ "$leaders" = 1 ] || return 1
  for n in "${named[@]}"; do [ "$n" = "${named[0]}" ] && [ -n "$n" ] || return 1; done
  if [ -n "$SHARDS" ]; then
    for i in "$@"; do n=$(owned "$i"); total=$((total + ${n:-0})); done
    [ "$total" = "$SHARDS" ] || return 1
  fi
}
leader_index() {
  local i
  for i in 0 1 2; do [ "$(status "$i" | field role)" = leader ] && { echo "$i"; return; }; done
  echo 0
}

echo "| run | killed | the two left serving after |"
echo "| --- | --- | --- |"
moves=()
for run in $(seq "$RUNS"); do
  until_true serving 0 1 2
  sleep 1
  if [ -n "$SHARDS" ]; then k=$(( (run - 1) % 3 )); else k=$(leader_index); fi
  others=()
  for i in 0 1 2; do [ "$i" = "$k" ] || others+=("$i"); done
  from=$(ms)
  kill -9 "${PID[$k]}"
  wait "${PID[$k]}" 2>/dev/null || true
  until_true serving "${others[@]}"
  moved=$(( $(ms) - from ))
  moves+=("$moved")
  echo "| $run | $k$([ -z "$SHARDS" ] && echo ' (leader)') | $moved ms |"
  start "$k"
  wait_for_server "$BIN" "${GRPC[$k]}"
done
python3 - "${moves[*]}" <<'PY'
import statistics, sys
moves = [int(x) for x in sys.argv[1].split()]
print(f"killed: median {statistics.median(moves):.0f} ms, worst {max(moves)} ms over {len(moves)} kills")
PY
