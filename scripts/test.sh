#!/usr/bin/env bash
# Runs every Tollgate test: the formatting and lint gates, then unit, integration, property,
# behavioural (every mode), simulation, CLI, examples, benchmarks (once each, as tests) and
# documentation examples. Installs what the tests need: redis-server (Debian's package) for the
# store-mode tests, which start their own servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing redis-server from Debian's packages" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "the store-mode tests need redis-server: install Debian's redis-server package" >&2
    exit 1
  fi
fi

# A clean build gains nothing from incremental compilation, which doubles what the workspace's
# own crates leave on disk.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

# Lint in CI, not in source: formatting, then clippy with warnings as errors (the clock ban and
# the docs lint live in clippy.toml and the workspace lints).
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

# The end-to-end test runs examples/kv-service as a real process: build it as a binary
# (`--all-targets` below builds examples only in test mode).
cargo build --workspace --examples --locked
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
