#!/usr/bin/env bash
# Runs every fuzz target under libFuzzer on the nightly toolchain, RUNS inputs each (default
# one million), and prints how many inputs each ran and whether it found anything. Installs
# cargo-fuzz from crates.io when it is missing. Not part of the test command (it takes
# minutes); `cargo test -p tollgate-cli --test it fuzz::` runs the same entry points on stable.
# Usage: scripts/fuzz.sh [TARGET...]  (default: all: settings_file scenario cli_args grpc_message admin_text)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000000}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# Seed corpora from what the repository already holds: the scenarios, every TOML block in
# the docs, and a few command lines. libFuzzer mutates from there.
# args FILE ARG...: one command line, NUL-separated, as the cli_args target reads it.
args() {
  local file=$1
  shift
  printf '%s' "$1" >"$file"
  shift
  for a in "$@"; do printf '\0%s' "$a" >>"$file"; done
}
seed() {
  local dir="fuzz/corpus/$1"
  mkdir -p "$dir"
  case "$1" in
    scenario) cp scenarios/*.toml "$dir/" ;;
    settings_file)
      awk -v dir="$dir" '/^```toml/{n++; on=1; next} /^```/{on=0} on{print > (dir "/doc-" n ".toml")}' \
        docs/*.md README.md ;;
    cli_args)
      args "$dir/server" server --data t.redb --listen 127.0.0.1:0
      args "$dir/group" group create t --limit 100 --reserved 10 --ramp min=10,max=100,duration_s=30
      args "$dir/quota" quota set t total_throughput 100
      args "$dir/bench" bench exchange --clients 10 --groups 2 --timeout-ms 100 ;;
    admin_text)
      printf '\0CREATE RESOURCE GROUP oltp RU_PER_SEC=20000, PRIORITY=HIGH, BURSTABLE; SHOW RESOURCE GROUPS' \
        >"$dir/sql"
      printf '\001{"capacity": 25000, "mode": "fcfs"}' >"$dir/node"
      printf '\002{"reserved": 100, "hard_limit": "unlimited"}' >"$dir/group"
      { printf '\003'; sed 's/busy_us/observed/' examples/calibration.csv; } >"$dir/csv" ;;
  esac
}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(settings_file scenario cli_args grpc_message admin_text)
mkdir -p target
# Build every target first, so that a build failure is told apart from a finding.
cargo +nightly fuzz build >target/fuzz-build.log 2>&1 || {
  echo "the fuzz targets do not build: see target/fuzz-build.log"
  exit 1
}
for target in "${TARGETS[@]}"; do
  corpus="fuzz/corpus/$target"
  seed "$target"
  log="target/fuzz-$target.log"
  if cargo +nightly fuzz run "$target" "$corpus" -- -runs="$RUNS" -max_len=4096 >"$log" 2>&1; then
    echo "$target: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1) no crash"
  else
    echo "$target: FOUND A CRASH, see $log and fuzz/artifacts/$target"
    exit 1
  fi
done
