# Shared by the bench scripts (sourced, not run): a free port on 127.0.0.1, and waiting for a
# controller to answer.

# Prints a port on 127.0.0.1 that nothing listens on now.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for the controller at gRPC address $2 (host:port) to answer `$1 status`;
# returns 1 if it never does.
wait_for_server() {
  for _ in $(seq 100); do "$1" status --server "http://$2" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
