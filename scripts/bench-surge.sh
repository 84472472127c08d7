#!/usr/bin/env bash
# A surge against a real service: a controller, examples/kv-service (1 MB/s, 4 slots) following
# it, and `tollgate bench surge`, which lifts bronze's limit and has it ask 1.6 times the
# service's capacity. Prints when bronze was marked busy, the peak utilisation and from when
# the utilisation stayed within 5 % of 1.
# Usage: scripts/bench-surge.sh [extra `bench surge` options]  (builds the release binaries;
# KV=path runs another build of the service, an older one say, beside this one)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
prepare_service_bench
start_server_and_service --capacity 1000000 --concurrency 4
"$BIN" bench surge --server "http://$GRPC" --service "$SERVICE" "$@"
