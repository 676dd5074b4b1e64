#!/usr/bin/env bash
# Runs `cargo test --locked [ARGS...]` in rust/ and ends with one summary line, "LABEL: N passed,
# M failed": cargo prints one result line per test binary (the last often a crate's empty
# doc-tests), so the totals are summed from them. Exits with cargo's status.
#   scripts/cargo_test.sh LABEL [cargo test arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
(cd rust && cargo test --locked "$@" 2>&1) | tee "$log" || status=$?
passed=$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed' "$log" |
  awk '{s += $4} END {print s + 0}')
failed=$(grep -o '[0-9]* failed;' "$log" | awk '{s += $1} END {print s + 0}')
echo "${label}: ${passed} passed, ${failed} failed"
exit "$status"
