#!/usr/bin/env bash
# The checks that need a machine with a CUDA GPU and torch (none of CI's machines): builds
# libanyattn.so and the Python package there, runs the device-route tests on the GPU, then, unless
# SKIP_CPU_ROWS is set, the host CPU's tile probe and torch comparison (AMX rows where the host
# has AMX). Logs and JSON go to $OUT (default /tmp/anyattn-gpu-check).
#
#   scripts/gpu_host_check.sh            # about 4 minutes on a 16-core host
#   SKIP_CPU_ROWS=1 scripts/gpu_host_check.sh
#
# Needs cmake, ninja, a C++ compiler, and python3 with torch (CUDA), numpy, pytest, nanobind and
# scikit-build-core; nothing is downloaded (pip runs without build isolation).
set -uo pipefail
OUT=${OUT:-/tmp/anyattn-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
step() { echo "=== $(date +%T) $*"; }

step machine
nproc
grep -o -E 'amx_bf16|amx_tile|avx512_bf16|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'

step build the library
build=/tmp/anyattn-gpu-check-build
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DANYATTN_BUILD_TESTS=OFF \
  -DANYATTN_BUILD_BENCH=OFF -DANYATTN_BUILD_STATIC=OFF -DANYATTN_INSTALL=OFF >/dev/null &&
  cmake --build "$build" -j "$(nproc)" >"$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
g++ -O2 -std=c++17 -Iinclude -Isrc bench/amx_tile_probe.cc -L"$build/src" -lanyattn \
  -Wl,-rpath,"$build/src" -o "$build/amx_tile_probe" || echo "tile probe: build failed"

step build the Python package
site=/tmp/anyattn-gpu-check-site
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps -q \
  --target "$site" . >"$OUT/pip.log" 2>&1 || tail -30 "$OUT/pip.log"
export PYTHONPATH=$site

step device-route tests
python3 -m pytest -q -p no:cacheprovider -rfE python/tests/test_device_route.py \
  python/tests/test_dispatch.py python/tests/test_kvcache_route.py \
  python/tests/test_packed_route.py python/tests/test_flash_attn_install.py 2>&1 |
  tee "$OUT/route.log" | tail -25
[ -n "${SKIP_CPU_ROWS:-}" ] && exit 0

step host tile probe
"$build/amx_tile_probe" --iterations 200000 2>&1 | tail -8
step torch comparison, 2 threads on cores 0-1
taskset -c 0,1 python3 bench/torch_sdpa.py --lib "$build/src/libanyattn.so" --quick \
  --threads-list 2 --no-backward --json "$OUT/sdpa2.json" 2>&1 | tail -28
step torch comparison, all cores
python3 bench/torch_sdpa.py --lib "$build/src/libanyattn.so" --quick \
  --threads-list "$(nproc)" --no-backward --no-decode --json "$OUT/sdpa_all.json" 2>&1 | tail -20
