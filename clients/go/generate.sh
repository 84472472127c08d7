#!/usr/bin/env bash
# Writes the Go code of Tollgate's contract (crates/proto/proto/tollgate/v1/tollgate.proto) into
# tollgatev1/, with Debian's protoc-gen-go and protoc-gen-go-grpc (packages of those names).
# `generate.sh --check` writes it elsewhere and fails when the committed code differs.
set -euo pipefail
cd "$(dirname "$0")"
module=github.com/tollgate-rs/tollgate/clients/go
out=.
if [ "${1:-}" = --check ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
map=Mtollgate/v1/tollgate.proto=$module/tollgatev1
protoc -I ../../crates/proto/proto \
  --go_out="$out" --go_opt=module=$module --go_opt="$map" \
  --go-grpc_out="$out" --go-grpc_opt=module=$module --go-grpc_opt="$map" \
  tollgate/v1/tollgate.proto
if [ "$out" != . ]; then
  for f in tollgatev1/tollgate.pb.go tollgatev1/tollgate_grpc.pb.go; do
    diff -q "$f" "$out/$f" >/dev/null || {
      echo "clients/go/$f is not what the proto makes now: run clients/go/generate.sh" >&2
      exit 1
    }
  done
fi
