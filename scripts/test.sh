#!/usr/bin/env bash
# Runs every test: set-up, then the C++ suite (ctest, Release), the C++ suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer with the reduced sweep, the Python tests (pytest)
# and the Rust crates (cargo test). Stops at the first failing stage; each runner prints its own
# summary line.
#   scripts/test.sh             everything
#   scripts/test.sh --fast      skip the sanitizer build
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
[ "${1:-}" = "--fast" ] && FAST=1

stage() { printf '\n=== %s ===\n' "$*"; }
JOBS=$(nproc)

stage "setup"
scripts/setup.sh --python

stage "C++ tests (Release)"
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS"
ctest --preset release -j "$JOBS"

if [ "$FAST" -eq 0 ]; then
  stage "C++ tests under ASan + UBSan (reduced sweep)"
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$JOBS"
  ctest --preset asan -j "$JOBS"
fi

stage "Python tests (pytest)"
.venv/bin/python -m pytest -q python/tests

stage "Rust tests (cargo test)"
(cd rust && cargo test --locked)
