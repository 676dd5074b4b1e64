#!/usr/bin/env bash
# The main job: set up, build in Release, and run the forward-attention benchmark on generated
# data. Prints one table row per shape (time, GFLOP/s, % of this machine's measured FMA peak,
# ratio to the unfused OpenBLAS baseline) and writes JSON. Arguments go to anyattn_bench, e.g.
#   scripts/bench.sh --quick
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target anyattn_bench
# Debian's OpenBLAS misdetects AVX-512 CPUs and runs SSE kernels unless told the core type.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Cooperlake
fi
exec build/release/bench/anyattn_bench "$@"
