#!/usr/bin/env bash
# Runs every fuzz target under libFuzzer on the nightly toolchain, RUNS inputs each (default
# one million), and prints how many inputs each ran and whether it found anything. Installs
# cargo-fuzz from crates.io when it is missing. Not part of the test command (it takes
# minutes); `cargo test -p tollgate-cli --test fuzz` runs the same entry points on stable.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000000}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
for target in settings_file scenario cli_args grpc_message; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus"
  log="target/fuzz-$target.log"
  mkdir -p target
  if cargo +nightly fuzz run "$target" "$corpus" -- -runs="$RUNS" -max_len=4096 >"$log" 2>&1; then
    echo "$target: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1) no crash"
  else
    echo "$target: FOUND A CRASH, see $log and fuzz/artifacts/$target"
    exit 1
  fi
done
