#!/usr/bin/env bash
# Request classes through an overload of a real service: a controller, examples/kv-service
# following it (400 kB/s, 4 slots), and `tollgate bench overload`, which offers critical work
# alone, then 4 times the service's capacity with classes and without. Prints the critical
# requests' success and p99 latency in each run beside the unloaded p99.
# Usage: scripts/bench-overload.sh [extra `bench overload` options]  (builds the release
# binaries)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_service_bench
start_server_and_service --capacity 400000 --concurrency 4
"$BIN" bench overload --server "http://$GRPC" --service "$SERVICE" "$@"
