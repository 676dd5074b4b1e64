#!/usr/bin/env bash
# Runs anyattn_bench with the OpenBLAS fix this machine class needs, passing every argument on.
#
# Debian's OpenBLAS 0.3.21 misdetects AVX-512 Xeons of this generation and falls back to SSE3
# kernels (about 6x slower), which would flatter anyattn's ratio to the baseline. When the CPU has
# avx512f and OPENBLAS_CORETYPE is unset, this script sets it to Cooperlake.
#
# The executable is looked up next to this script (the copy in the build tree), then in
# $ANYATTN_BUILD_DIR/bench, build-bench/bench and build/bench of the repository.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(cd "${script_dir}/.." && pwd)"
bench_exe=""
for candidate in "${script_dir}/anyattn_bench" \
                 "${ANYATTN_BUILD_DIR:-/nonexistent}/bench/anyattn_bench" \
                 "${repo_dir}/build-bench/bench/anyattn_bench" \
                 "${repo_dir}/build/bench/anyattn_bench"; do
  if [[ -x "${candidate}" ]]; then
    bench_exe="${candidate}"
    break
  fi
done
if [[ -z "${bench_exe}" ]]; then
  echo "anyattn_bench not found; build it first, e.g." >&2
  echo "  cmake -S ${repo_dir} -B ${repo_dir}/build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release" >&2
  echo "  ninja -C ${repo_dir}/build-bench anyattn_bench" >&2
  exit 1
fi

if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && grep -qw avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Cooperlake
fi
exec "${bench_exe}" "$@"
