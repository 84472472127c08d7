#!/usr/bin/env bash
# Checks and tests the Go module offline, from Debian's Go and its packaged sources under
# /usr/share/gocode (golang-google-grpc-dev, golang-google-protobuf-dev,
# golang-github-golang-protobuf-1-5-dev): the module is put on a GOPATH of its own beside them,
# as Go's GOPATH mode reads it, so nothing is fetched. The generated code must be current and
# the rest formatted as gofmt writes it; then go vet and go test (against the server
# TOLLGATE_BIN names), the benchmarks run once each.
set -euo pipefail
cd "$(dirname "$0")"
./generate.sh --check
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "not formatted as gofmt writes it: $unformatted" >&2; exit 1; }
work=$(cd ../.. && pwd)/target/go
module=github.com/tollgate-rs/tollgate/clients/go
mkdir -p "$work/src/$(dirname "$module")"
ln -sfn "$(pwd)" "$work/src/$module"
export GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="$work/cache" GOFLAGS=
cd "$work/src/$module"
go vet ./...
go test -count=1 -bench . -benchtime 1x ./...
