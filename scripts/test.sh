#!/usr/bin/env bash
# Runs every Tollgate test: unit, integration, property, CLI, examples, benchmarks (once
# each, as tests) and documentation examples. Installs and starts whatever the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
