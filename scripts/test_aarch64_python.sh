#!/usr/bin/env bash
# The Python package cross-compiled for AArch64 and tested under qemu-user: the extension
# anyattn._core built with the same CMake toolchain file as scripts/test_aarch64.sh, imported by
# an AArch64 CPython 3.11 from Debian's arm64 packages, with numpy's aarch64 wheel. It runs
# python/tests/aarch64/test_numpy_path.py (the numpy path against the float64 reference: f32
# and f16, masks, GQA, softcap, varlen, KV-cache decode, the LSE, and the dispatch choosing neon)
# twice, with no ANYATTN_ISA: QEMU_CPU=max (every extension qemu models), then cortex-a53 (plain
# Armv8.0, where the NEON kernels must still be chosen and use nothing the CPU lacks).
# ANYATTN_AARCH64_CPUS="max" runs one model only.
#
# Nothing is installed system-wide: installing libpython3.11-dev:arm64 would upgrade installed
# amd64 packages to the arm64 ones' versions (about 30 of them on Debian 12). The arm64 .debs are
# fetched with `apt-get download` and unpacked with `dpkg -x` into build/aarch64-python/sysroot;
# a small C program calling Py_BytesMain, linked against their libpython3.11.so, is the
# interpreter. numpy and pytest come from PyPI as aarch64 (or pure-Python) wheels, pinned to the
# versions in .venv. Each of these is fetched once and kept; the extension is rebuilt
# incrementally and the package folder copied afresh on every run.
#
# Left out, with the reason: torch. PyPI's aarch64 wheel of torch 2.15 is the CUDA build (484 MB),
# whose `import torch` stops without cuBLAS (it preloads it from the nvidia-* wheels); the
# CPU-only aarch64 wheels are on PyTorch's own index, which CI cannot reach. `import torch` is
# made to fail, so the package takes its numpy-only path, as in test_without_torch.py. Also left
# out: the stdlib modules whose shared libraries are not fetched (sqlite3, curses, dbm, readline,
# ...), which neither numpy, pytest nor anyattn import.
#
# Needs the arm64 apt architecture, g++-aarch64-linux-gnu, qemu-user and .venv with nanobind,
# numpy and pytest (scripts/setup.sh --python prepares all of them). Network on first use only.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
OUT="$PWD/build/aarch64-python"
SYSROOT="$OUT/sysroot"
SITE="$OUT/site-packages"
PKG="$OUT/package"
PYTHON="$SYSROOT/usr/bin/python3.11"
VENV_PYTHON=.venv/bin/python
TOOLCHAIN="$PWD/cmake/toolchains/aarch64-linux-gnu.cmake"

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "test_aarch64_python: the arm64 apt architecture is missing; run scripts/setup.sh" >&2
  exit 1
fi

# CPython's runtime and headers, and the shared libraries that libpython3.11 (expat, zlib) and
# the stdlib extension modules a run of these tests loads need: _ctypes (libffi; numpy),
# _hashlib (libssl3's libcrypto), _bz2, _lzma and _uuid.
DEBS=(libpython3.11-dev libpython3.11 libpython3.11-stdlib libpython3.11-minimal libexpat1 zlib1g
      libffi8 libssl3 libbz2-1.0 liblzma5 libuuid1)
if [ ! -f "$SYSROOT/.debs" ] || [ "$(cat "$SYSROOT/.debs")" != "${DEBS[*]}" ]; then
  echo "== fetching ${DEBS[*]} (arm64) into $SYSROOT"
  rm -rf "$SYSROOT" "$OUT/debs"
  mkdir -p "$OUT/debs"
  if ! (cd "$OUT/debs" && apt-get download "${DEBS[@]/%/:arm64}") >"$OUT/debs.log" 2>&1; then
    cat "$OUT/debs.log" >&2
    exit 1
  fi
  for deb in "$OUT"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  rm -rf "$OUT/debs"
  # Debian's python3.11/pyconfig.h includes the multiarch one by target macros; put the aarch64
  # header in its place, so that one include directory serves the cross build.
  cp "$SYSROOT/usr/include/aarch64-linux-gnu/python3.11/pyconfig.h" \
    "$SYSROOT/usr/include/python3.11/pyconfig.h"
  # The interpreter, in usr/bin so that CPython finds its stdlib beside it (sys.prefix =
  # $SYSROOT/usr). DT_RPATH, unlike RUNPATH, also serves the libraries that libpython and the
  # stdlib's extension modules load; the C library comes from qemu's -L /usr/aarch64-linux-gnu.
  mkdir -p "$SYSROOT/usr/bin"
  printf '%s\n' '#include <Python.h>' \
    'int main(int argc, char **argv) { return Py_BytesMain(argc, argv); }' >"$OUT/python3.c"
  aarch64-linux-gnu-gcc -O2 -I "$SYSROOT/usr/include/python3.11" "$OUT/python3.c" -o "$PYTHON" \
    -L "$SYSROOT/usr/lib/aarch64-linux-gnu" -lpython3.11 \
    -Wl,-rpath-link,"$SYSROOT/lib/aarch64-linux-gnu" -Wl,--disable-new-dtags \
    -Wl,-rpath,'$ORIGIN/../lib/aarch64-linux-gnu:$ORIGIN/../../lib/aarch64-linux-gnu'
  echo "${DEBS[*]}" >"$SYSROOT/.debs"
fi

# numpy (the aarch64 wheel; its platform tag exactly, as pip does not widen a manylinux_2_x tag
# given with --platform), pytest and pytest's dependencies, at .venv's versions.
PINS=$("$VENV_PYTHON" -c 'import importlib.metadata as m
print(" ".join(p + "==" + m.version(p)
               for p in ("numpy", "pytest", "iniconfig", "packaging", "pluggy", "pygments")))')
if [ ! -f "$SITE/.pins" ] || [ "$(cat "$SITE/.pins")" != "$PINS" ]; then
  echo "== installing $PINS (aarch64) into $SITE"
  rm -rf "$SITE"
  # shellcheck disable=SC2086  # PINS is a list of requirements
  "$VENV_PYTHON" -m pip install -q --no-deps --no-compile --target "$SITE" --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp --abi cp311 $PINS
  echo "$PINS" >"$SITE/.pins"
fi

# The extension alone, against the extracted headers, with nanobind's CMake files from .venv.
# FindPython's interpreter is .venv's (a 3.11 like the target), so the SOABI it reports is the
# host's; SKBUILD_SOABI, which nanobind prefers (scikit-build-core sets it in cross builds), names
# the target's.
cmake -S . -B "$OUT/build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DCMAKE_BUILD_TYPE=Release \
  -DANYATTN_BUILD_PYTHON=ON -DANYATTN_BUILD_TESTS=OFF -DANYATTN_BUILD_BENCH=OFF \
  -DANYATTN_BUILD_SHARED=OFF -DANYATTN_INSTALL=OFF \
  -DPython_EXECUTABLE="$PWD/$VENV_PYTHON" -DPython_INCLUDE_DIR="$SYSROOT/usr/include/python3.11" \
  -Dnanobind_DIR="$("$VENV_PYTHON" -m nanobind --cmake_dir)" \
  -DSKBUILD_SOABI=cpython-311-aarch64-linux-gnu >/dev/null
cmake --build "$OUT/build" -j "$JOBS" --target _core
CORE="$OUT/build/python/_core.cpython-311-aarch64-linux-gnu.so"

# The package as pip would install it: python/anyattn and the extension beside it.
rm -rf "$PKG"
mkdir -p "$PKG"
cp -r python/anyattn "$PKG/anyattn"
find "$PKG" \( -name __pycache__ -o -name '*.so' \) -prune -exec rm -rf {} +
cp "$CORE" "$PKG/anyattn/"

# pytest's last line counts the results ("2 failed, 17 passed in 9.1s"); an error (in
# collection, say) counts as a failure, and so does a run that ends without that line.
count() { { grep -Eo "[0-9]+ $1" <<<"$2" || true; } | awk '{s += $1} END {print s + 0}'; }

# The byte code goes to build/aarch64-python/pycache, not into the source tree or the sysroot.
passed=0
failed=0
for cpu in ${ANYATTN_AARCH64_CPUS:-max cortex-a53}; do
  echo "== qemu-aarch64 -cpu $cpu (no ANYATTN_ISA)"
  start=$SECONDS
  log="$OUT/pytest-$cpu.log"
  status=0
  env -u ANYATTN_ISA QEMU_CPU="$cpu" PYTHONPATH="$PKG:$SITE" PYTHONPYCACHEPREFIX="$OUT/pycache" \
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$PYTHON" -s -c \
    'import sys; sys.modules["torch"] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))' \
    -q -p no:cacheprovider python/tests/aarch64/test_numpy_path.py 2>&1 | tee "$log" || status=$?
  summary=$(tail -n 1 "$log")
  run_failed=$(($(count failed "$summary") + $(count error "$summary")))
  if [ "$status" -ne 0 ] && [ "$run_failed" -eq 0 ]; then run_failed=1; fi
  passed=$((passed + $(count passed "$summary")))
  failed=$((failed + run_failed))
  echo "== -cpu $cpu: $((SECONDS - start)) s"
done
echo "python on aarch64 (qemu): ${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
