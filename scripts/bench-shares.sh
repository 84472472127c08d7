#!/usr/bin/env bash
# Shares follow the load: three release controllers on a stock etcd, no tuning, one group of
# 1,000 units/s. Checks (`POST /v1/check`, 10 units each) ask 600 units/s through each
# controller; then the load moves: two fall silent and the third asks 2,000 units/s. MOVES
# times (10), the load spread again between moves. Prints, per move, what the busy controller
# admitted in each of the four seconds after the move (as a share of the limit), and what
# the three admitted together in the second 10 s after the load spread (steady, all asked).
# Usage: scripts/bench-shares.sh  (builds the release binary with etcd; needs Debian's
# etcd-server and python3). MOVES may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_cluster_bench
MOVES=${MOVES:-10}
PID=()
ETCD_PID=
trap stop_cluster_bench EXIT

start_etcd "$WORK"
start() { start_controller "$1"; }
start_three
"$BIN" group create g --limit 1000 --server "http://${GRPC[0]}" >/dev/null
python3 - "$MOVES" "${HTTP[@]}" <<'PY'
import http.client, statistics, sys, threading, time

moves, hosts = int(sys.argv[1]), sys.argv[2:]
COST = 10
rate = [60.0, 60.0, 60.0]  # requests/s through each controller
admitted = [0, 0, 0]
stop = False

def load(i):
    host, port = hosts[i].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    body = '{"group":"g","cost":%d}' % COST
    next_at = time.monotonic()
    while not stop:
        asked = rate[i]
        if asked <= 0:
            time.sleep(0.005)
            next_at = time.monotonic()
            continue
        conn.request("POST", "/v1/check", body, {"content-type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status == 200:
            admitted[i] += COST
        next_at += 1.0 / asked
        time.sleep(max(0.0, next_at - time.monotonic()))

def per_second(seconds, which):
    out = []
    for _ in range(seconds):
        before = [admitted[i] for i in which]
        t = time.monotonic()
        time.sleep(1.0)
        took = time.monotonic() - t
        out.append((sum(admitted[i] for i in which) - sum(before)) / took)
    return out

threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(3)]
for t in threads:
    t.start()
time.sleep(10)
print("| move | busy one, 1st s | 2nd s | 3rd s | 4th s | all three asked, steady |")
print("| --- | --- | --- | --- | --- | --- |")
thirds, steady = [], []
for m in range(moves):
    busy = m % 3
    for i in range(3):
        rate[i] = 200.0 if i == busy else 0.0
    after = per_second(4, [busy])
    for i in range(3):
        rate[i] = 60.0
    # The next move lands at another point of the controllers' second-long tick.
    time.sleep(10 + (0.37 * m) % 1.0)
    spread = per_second(10, [0, 1, 2])
    thirds.append(after[2])
    steady.append(max(spread))
    cells = " | ".join(f"{a / 10:.1f} %" for a in after)
    print(f"| {m + 1} | {cells} | {max(spread) / 10:.1f} % at most |")
stop = True
print(f"third second after a move: median {statistics.median(thirds) / 10:.1f} %, worst {min(thirds) / 10:.1f} %; "
      f"all asked: at most {max(steady) / 10:.1f} % of the limit in a second")
PY
