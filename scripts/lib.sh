# Shared by the bench scripts (sourced, not run): a free port on 127.0.0.1, waiting for a
# controller to answer, and starting one with examples/kv-service beside it.

# Prints a port on 127.0.0.1 that nothing listens on now.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for the controller at gRPC address $2 (host:port) to answer `$1 status`;
# returns 1 if it never does.
wait_for_server() {
  for _ in $(seq 100); do "$1" status --server "http://$2" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

# Starts a release controller ($BIN) on the embedded store in $DATA and examples/kv-service
# ($KV) following it with the options given ("$@"), on free ports: sets GRPC and SERVICE, and
# SERVER and KV_PID for the caller's cleanup.
start_server_and_service() {
  GRPC=127.0.0.1:$(free_port)
  local http=127.0.0.1:$(free_port)
  SERVICE=127.0.0.1:$(free_port)
  # One service, one zone: no zone to ignore.
  "$BIN" server --data "$DATA" --grpc "$GRPC" --http "$http" --ignore-worst-zones 0 >"$DATA/server.log" 2>&1 &
  SERVER=$!
  wait_for_server "$BIN" "$GRPC" || true
  "$KV" --controller "http://$GRPC" --listen "$SERVICE" "$@" >"$DATA/kv.log" 2>&1 &
  KV_PID=$!
  for _ in $(seq 100); do grep -q "listening on" "$DATA/kv.log" && break; sleep 0.1; done
}

# For a service bench: builds the release binaries, sets BIN, KV (unless given) and DATA (a
# temporary directory), and stops what start_server_and_service started when the script ends.
prepare_service_bench() {
  cargo build --release -q -p tollgate-cli
  cargo build --release -q -p tollgate-limiter --example kv-service
  BIN=target/release/tollgate
  KV=${KV:-target/release/examples/kv-service}
  DATA=$(mktemp -d)
  trap 'stop_server_and_service; rm -rf "$DATA"' EXIT
}

# Stops the controller and the service start_server_and_service started.
stop_server_and_service() {
  kill "${KV_PID:-}" "${SERVER:-}" 2>/dev/null || true
  wait 2>/dev/null || true
  KV_PID= SERVER=
}

# Starts a one-member etcd on free ports, its data under $1, with any more options given:
# sets ETCD_URL and ETCD_PID, and waits up to 10 s for it to answer.
start_etcd() {
  local dir=$1
  shift
  local client peer
  client=$(free_port) peer=$(free_port)
  etcd --name bench --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "bench=http://127.0.0.1:$peer" \
    "$@" >"$dir/etcd.log" 2>&1 &
  ETCD_PID=$!
  ETCD_URL=http://127.0.0.1:$client
  for _ in $(seq 100); do curl -sf "$ETCD_URL/health" >/dev/null && break; sleep 0.1; done
}

# For a bench of several controllers: builds the release binary with etcd, sets BIN, WORK (a
# temporary directory) and the exchange load's SECONDS_EACH (10), CLIENTS (1000), GROUPS_EACH
# (from GROUPS_PER_CLIENT, 10) and RATE (2), each unless the environment sets it.
prepare_cluster_bench() {
  cargo build --release -q -p tollgate-cli --features etcd
  BIN=target/release/tollgate
  SECONDS_EACH=${SECONDS_EACH:-10}
  CLIENTS=${CLIENTS:-1000}
  GROUPS_EACH=${GROUPS_PER_CLIENT:-10}
  RATE=${RATE:-2}
  WORK=$(mktemp -d)
}

# Stops what a cluster bench started (the controllers in PID, etcd in ETCD_PID) and removes
# $WORK: for `trap stop_cluster_bench EXIT`.
stop_cluster_bench() {
  for p in "${PID[@]}" $ETCD_PID; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

# Writes one gRPC-framed request to Envoy's rate-limit service to $1: domain edge, one
# descriptor tenant=acme (the default rule names the group).
write_rls_request() {
  python3 - "$1" <<'PY'
import sys
def field(n, payload): return bytes([n << 3 | 2]) + bytes([len(payload)]) + payload
msg = field(1, b"edge") + field(2, field(1, field(1, b"tenant") + field(2, b"acme")))
open(sys.argv[1], "wb").write(b"\0" + len(msg).to_bytes(4, "big") + msg)
PY
}

# Starts controller $1 of a cluster bench on etcd ($ETCD_URL) with the options after it, its
# addresses GRPC[$1] and HTTP[$1] and its data under $WORK: sets PID[$1].
start_controller() {
  local i=$1
  shift
  "$BIN" server --etcd "$ETCD_URL" "$@" \
    --grpc "${GRPC[$i]}" --http "${HTTP[$i]}" --data "$WORK/data-$i" >>"$WORK/server-$i.log" 2>&1 &
  PID[$i]=$!
}

# Starts three controllers on free ports with `start` (a function of the index) and waits
# for each to answer: sets GRPC and HTTP.
start_three() {
  local i
  GRPC=() HTTP=()
  for i in 0 1 2; do
    GRPC+=("127.0.0.1:$(free_port)")
    HTTP+=("127.0.0.1:$(free_port)")
    start "$i"
  done
  for i in 0 1 2; do wait_for_server "$BIN" "${GRPC[$i]}"; done
}

# Milliseconds since the epoch, and until a condition holds (polled every 10 ms, 30 s at most).
ms() { date +%s%3N; }
until_true() {
  for _ in $(seq 3000); do "$@" && return 0; sleep 0.01; done
  echo "never: $*" >&2
  exit 1
}
