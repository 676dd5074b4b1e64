#!/usr/bin/env bash
# The Rust crates cross-compiled for AArch64 (aarch64-unknown-linux-gnu) and their tests run under
# qemu-user: anyattn-sys (its build.rs builds the C++ library with the same CMake toolchain file
# as scripts/test_aarch64.sh), anyattn, candle-anyattn and candle-flash-attn. QEMU_CPU=max, and
# no path is forced: the library's own dispatch picks NEON, as on an Arm machine.
#
# Left out, with the reason: candle-flash-attn-upstream-tests, whose dev-dependencies (candle-nn
# and what it pulls in) would more than double the cross build's time; the native `cargo test`
# stage runs it.
#
# Needs the rustup target aarch64-unknown-linux-gnu (scripts/setup.sh --python adds it), Debian's
# g++-aarch64-linux-gnu and qemu-user. The build goes to rust/target/aarch64-unknown-linux-gnu.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$TARGET"; then
  echo "test_aarch64_rust: the Rust target $TARGET is not installed;" \
    "run scripts/setup.sh --python" >&2
  exit 1
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
export ANYATTN_SYS_CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$PWD/cmake/toolchains/aarch64-linux-gnu.cmake"
export QEMU_CPU=max

scripts/cargo_test.sh "rust on aarch64 (qemu)" --target "$TARGET" -p anyattn-sys -p anyattn \
  -p candle-anyattn -p candle-flash-attn
