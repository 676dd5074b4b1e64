#!/usr/bin/env bash
# Builds the libFuzzer harnesses (the `fuzz` CMake preset: clang, ASan + UBSan) and runs each for
# a bounded time from its committed seed corpus (fuzz/corpus/<harness>/). New corpus entries go to
# a scratch directory, never into the committed corpus; crash reproducers go to build/fuzz/crashes/.
#   fuzz/run_fuzzers.sh            60 s per harness
#   fuzz/run_fuzzers.sh 120        120 s per harness
# Ends with "N passed, M failed"; exits non-zero if any harness failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_FUZZER="${1:-60}"
HARNESSES=(fuzz_fwd fuzz_bwd fuzz_varlen fuzz_bwd_varlen fuzz_kvcache fuzz_kvcache8 fuzz_merge)
JOBS=$(nproc)

cmake --preset fuzz >/dev/null || exit 1
cmake --build --preset fuzz -j "$JOBS" || exit 1

CRASHES=build/fuzz/crashes
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$CRASHES"
passed=0
failed=0
for harness in "${HARNESSES[@]}"; do
  mkdir -p "$SCRATCH/$harness"
  log="build/fuzz/$harness.log"
  printf '%-16s %ss ... ' "$harness" "$SECONDS_PER_FUZZER"
  if ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1" \
     UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
     "build/fuzz/fuzz/$harness" -max_total_time="$SECONDS_PER_FUZZER" -max_len=4096 \
       -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$CRASHES/$harness-" "$SCRATCH/$harness" "fuzz/corpus/$harness" \
       >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    echo "ok (${runs:-?} runs)"
    passed=$((passed + 1))
  else
    echo "FAILED (see $log and $CRASHES/)"
    grep -m 5 -E 'ERROR|anyattn fuzz check failed|runtime error' "$log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
