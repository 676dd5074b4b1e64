#!/usr/bin/env bash
# Runs every test, after set-up (scripts/setup.sh --python):
#   1. the C++ suite (ctest, Release): forward, varlen, KV cache, merge, backward, reliability,
#      the C++ header, the examples and the install/consumer test;
#   2. the C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer (reduced sweep);
#   3. the concurrency and resource tests under ThreadSanitizer;
#   4. each libFuzzer harness for 60 s (fuzz/run_fuzzers.sh);
#   5. the C++ suite cross-compiled for AArch64, under qemu-user (scripts/test_aarch64.sh);
#   6. the Rust crates cross-compiled for AArch64, under qemu-user (scripts/test_aarch64_rust.sh);
#   7. the Python package cross-compiled for AArch64, under qemu-user
#      (scripts/test_aarch64_python.sh);
#   8. the manylinux wheel, installed and run where no compiler is on PATH (scripts/test_wheel.sh);
#   9. the Python package (pytest);
#  10. the Rust crates (cargo test).
# Stops at the first failing stage; each runner prints its own summary line.
#   scripts/test.sh            everything
#   scripts/test.sh --fast     stages 1, 9 and 10 only
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

  stage "Concurrency and resource tests under TSan"
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j "$JOBS" --target anyattn_reliability_tests anyattn_internal_tests
  ctest --preset tsan -R Reliability

  stage "Fuzzers (60 s each)"
  fuzz/run_fuzzers.sh 60

  stage "C++ tests on AArch64 (cross-compiled, qemu-user, reduced sweep)"
  scripts/test_aarch64.sh

  stage "Rust crates on AArch64 (cross-compiled, qemu-user)"
  scripts/test_aarch64_rust.sh

  stage "Python package on AArch64 (cross-compiled, qemu-user)"
  scripts/test_aarch64_python.sh

  stage "Wheel (build, auditwheel repair, install without a compiler)"
  scripts/test_wheel.sh
fi

stage "Python tests (pytest)"
.venv/bin/python -m pytest -q python/tests

stage "Rust tests (cargo test)"
scripts/cargo_test.sh rust
