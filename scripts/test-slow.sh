#!/usr/bin/env bash
# The slow checks: every test marked `#[ignore = "slow: …"]` (a sweep of thousands of seeds, a
# soak), too long for the test command and run before a release (CONTRIBUTING.md,
# "Releasing"). Needs what scripts/test.sh installs; run that first on a new machine.
#
#   scripts/test-slow.sh                 # all of them
#   scripts/test-slow.sh -E 'test(/faults/)'   # some, by nextest's filter expressions
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo nextest run --workspace --all-features --locked --profile slow --run-ignored only "$@"
