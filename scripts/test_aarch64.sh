#!/usr/bin/env bash
# The C++ suite cross-compiled for AArch64 and run under qemu-user, three times:
#   1. QEMU_CPU=max (every extension qemu models: FP16, FHM, BF16, SVE) with ANYATTN_ISA=neon, so
#      that every call that does not name a path runs the NEON kernels; the tests that compare
#      paths run both neon and portable;
#   2. QEMU_CPU=cortex-a53, a plain Armv8.0 CPU without those extensions, without forcing: the
#      dispatcher must still choose neon (env.isa_neon_by_default) and nothing may use an
#      instruction the CPU lacks (qemu raises SIGILL). To keep the stage short this run takes the
#      tests that enumerate the paths (every kernel family on every runnable path, the vector
#      math, the registry, dispatch and the headers), not the sweeps the first run covers;
#      ANYATTN_AARCH64_FALLBACK_TESTS='.' runs everything;
#   3. compiled by clang instead of GCC (cmake/toolchains/aarch64-linux-gnu-clang.cmake, into
#      build/aarch64-clang): clang is the compiler of Apple's toolchain, whose macOS build cannot
#      run here. The library and the suite build with -Werror (a GCC-only flag or construct shows
#      up as a clang warning), and the path-enumerating tests of run 2 plus the 8-bit cache tests
#      and those of the BFDOT and FMLAL score kernels (FwdNarrowScores, FwdDecodeBf16Dot: clang
#      compiles their intrinsics its own way) run under QEMU_CPU=max with the dispatcher's choice
#      (neon). ANYATTN_AARCH64_CLANG=0 skips it.
# All with the target's compiler defaults (fused multiply-add, -ffp-contract=fast, unsigned char)
# and none of the x86 code compiled in. Reduced sweep, as under the sanitizers; qemu runs the tests
# several times slower than native. (qemu on an x86 host does not reproduce Arm's weaker memory
# ordering; TSan covers the pool's synchronisation.) ANYATTN_AARCH64_CPUS="max" runs one model only.
#
# Excluded, with the reason:
#   ReliabilityResources.{ChildProcessCanCallAfterForkAndExitCleanly,
#     ForkWhileAnotherThreadIsInsideACall, ProcessExitsCleanlyAfterUsingThePool}: a child forked
#     from a multithreaded process cannot start threads under qemu-user 7.2 (it aborts in
#     qemu_plugin_vcpu_init_hook with status 127; plain C++ programs do the same);
#   install_consumer_*: they configure and build a consumer project for the host against the
#     installed library, which a cross build cannot link.
# Needs g++-aarch64-linux-gnu, qemu-user and libgtest-dev's sources (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
TOOLCHAIN="$PWD/cmake/toolchains/aarch64-linux-gnu.cmake"

if [ ! -f build/aarch64-gtest/lib/libgtest.a ]; then
  cmake -S /usr/src/googletest -B build/aarch64-gtest-build -G Ninja \
    -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$PWD/build/aarch64-gtest" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
  cmake --build build/aarch64-gtest-build -j "$JOBS" >/dev/null
  cmake --install build/aarch64-gtest-build >/dev/null
fi

cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
  -DCMAKE_BUILD_TYPE=Release -DANYATTN_BUILD_BENCH=OFF -DANYATTN_BUILD_PYTHON=OFF >/dev/null
cmake --build build/aarch64 -j "$JOBS"
EXCLUDE='ChildProcessCanCallAfterFork|ForkWhileAnotherThreadIsInsideACall'
EXCLUDE+='|ProcessExitsCleanlyAfterUsingThePool|install_consumer_'
FALLBACK_TESTS=${ANYATTN_AARCH64_FALLBACK_TESTS:-'^(Isa|env|VecMath|KernelRegistry|FwdDecode|FwdDropout|c_abi|Hpp[A-Za-z]*)\.|^BwdGrad\.EveryIsaPath$|^KvcacheVarlen\.SplitsAndIsaPaths$'}
for cpu in ${ANYATTN_AARCH64_CPUS:-max cortex-a53}; do
  forced=()
  selected=()
  if [ "$cpu" = max ]; then forced=(ANYATTN_ISA=neon); else selected=(-R "$FALLBACK_TESTS"); fi
  echo "== qemu-aarch64 -cpu $cpu ${forced[*]:-(no ANYATTN_ISA)}"
  start=$SECONDS
  env QEMU_CPU="$cpu" "${forced[@]}" ANYATTN_TEST_SWEEP=reduced \
    ctest --test-dir build/aarch64 -j "$JOBS" -E "$EXCLUDE" "${selected[@]}" --output-on-failure
  echo "== -cpu $cpu: $((SECONDS - start)) s"
done

if [ "${ANYATTN_AARCH64_CLANG:-1}" != 0 ]; then
  cmake -S . -B build/aarch64-clang -G Ninja \
    -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchains/aarch64-linux-gnu-clang.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DANYATTN_BUILD_BENCH=OFF -DANYATTN_BUILD_PYTHON=OFF \
    -DCMAKE_C_FLAGS=-Werror -DCMAKE_CXX_FLAGS=-Werror >/dev/null
  cmake --build build/aarch64-clang -j "$JOBS"
  echo "== clang build, qemu-aarch64 -cpu max (no ANYATTN_ISA)"
  start=$SECONDS
  env QEMU_CPU=max ANYATTN_TEST_SWEEP=reduced \
    ctest --test-dir build/aarch64-clang -j "$JOBS" -E "$EXCLUDE" \
    -R "$FALLBACK_TESTS|^Kvcache8bit\\.|^FwdNarrowScores\\.|^FwdDecodeBf16Dot\\." \
    --output-on-failure
  echo "== clang build: $((SECONDS - start)) s"
fi
