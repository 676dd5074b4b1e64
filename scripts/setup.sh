#!/usr/bin/env bash
# Installs everything anyattn's build, tests and benchmark need on a fresh Debian machine, and
# nothing twice: system packages (apt, and the arm64 apt architecture), and with --python the
# virtual environment .venv with the Python package built from this tree and installed into it,
# and rustup's aarch64-unknown-linux-gnu target. Safe to run repeatedly. The one thing it does not
# install is the Rust toolchain (>= 1.82, rustup), which this kind of machine has.
#
#   scripts/setup.sh            system packages only
#   scripts/setup.sh --python   system packages, then .venv with numpy, pytest, torch (CPU use
#                               of the PyPI wheel), transformers, matplotlib (the benchmark
#                               plot), ggml-python (optional), and
#                               anyattn built from this tree; the aarch64 Rust target
set -euo pipefail
cd "$(dirname "$0")/.."

# clang and its runtime serve the libFuzzer harnesses (fuzz/), the AArch64 cross compiler and
# qemu-user the Arm test stage (scripts/test_aarch64.sh); everything else is the build.
SYSTEM_PACKAGES=(cmake ninja-build g++ pkg-config ccache libgtest-dev libopenblas-dev python3-venv
                 clang libclang-rt-14-dev g++-aarch64-linux-gnu qemu-user)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_system_packages() {
  local missing=()
  for package in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # The arm64 package lists, from which scripts/test_aarch64_python.sh downloads (never installs)
  # an AArch64 CPython.
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup: adding the arm64 apt architecture"
    as_root dpkg --add-architecture arm64
    as_root apt-get update -qq
  fi
}

# ring-flash-attn, the ring attention that python/tests/test_ring_flash_attn.py and
# bench/ring_attention.py run over anyattn's flash-attn layer (docs/distributed.md). Its package
# imports transformers' is_flash_attn_greater_or_equal_2_10, which transformers 5 removed, so it
# gets a transformers 4.x of its own in build/ring-deps, with the huggingface-hub, tokenizers and
# requests versions that 4.x accepts; everything else (torch, numpy, ...) comes from .venv. The
# directory goes first on sys.path in those tests' and that benchmark's worker processes only.
# --no-deps with every package pinned keeps torch out and the set exact.
RING_DEPS_DIR=build/ring-deps
RING_DEPS=(ring-flash-attn==0.1.8 transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2
           requests==2.34.2 urllib3==2.8.0 charset-normalizer==3.5.3 certifi==2026.10.19.post1)

# Installs pinned packages with --no-deps into a --target directory (its first argument) unless its
# stamp file says the same pins are there already. Compiled wheels (tokenizers, charset-normalizer,
# pyzmq, ...) are per Python version, so the stamp names the Python too.
install_pinned_into() {
  local dir="$1"
  shift
  local stamp="$dir/.installed"
  local wanted
  wanted="$(.venv/bin/python -c 'import sys; print("python%d.%d" % sys.version_info[:2])') $*"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    return
  fi
  echo "setup: installing $* into $dir"
  rm -rf "$dir"
  .venv/bin/python -m pip install -q --no-deps --target "$dir" "$@"
  echo "$wanted" >"$stamp"
}

install_ring_flash_attn_deps() {
  install_pinned_into "$RING_DEPS_DIR" "${RING_DEPS[@]}"
}

# sglang, whose real plugin loader, argument parser and VisionAttention layer
# python/tests/test_sglang_plugin.py drives (anyattn's sglang plugin: docs/python.md). sglang's
# full dependency set is a CUDA serving stack, so build/sglang-deps gets sglang alone (--no-deps)
# and exactly the packages that importing sglang.srt.plugins, sglang.srt.server_args and
# sglang.srt.layers.attention.vision needs on CPU beside .venv's torch, transformers, numpy,
# pydantic and pillow; sglang's own pins where it has them (apache-tvm-ffi, sentencepiece,
# compressed-tensors, openai). The test appends the directory to sys.path, so .venv's packages
# win wherever both have one.
SGLANG_DEPS_DIR=build/sglang-deps
SGLANG_DEPS=(sglang==0.5.23 apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0
             openai==2.8.0 httpx==0.29.0 distro==1.9.0 sniffio==1.3.1 orjson==3.13.0
             psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0
             certifi==2026.10.19.post1 starlette==1.10.0 msgspec==0.23.0 pyzmq==27.3.0
             ipython==9.18.1 traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0
             yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0
             frozenlist==1.8.0 einops==0.8.2 torchvision==0.29.2 dill==0.4.1 loguru==0.7.3
             gguf==0.19.0 partial-json-parser==0.2.1.1.post7)

install_sglang_test_deps() {
  install_pinned_into "$SGLANG_DEPS_DIR" "${SGLANG_DEPS[@]}"
}

install_python_environment() {
  if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
  fi
  # Build requirements are installed up front so the package builds without isolation, reusing
  # its CMake build directory (build/python-*) and ccache between runs.
  .venv/bin/python -m pip install -q --upgrade pip
  # torch and transformers are pinned: the integration tests drive transformers' model code, whose
  # attention calls (packing kwargs, mask builders) change between releases, and sglang's pinned
  # torchvision (build/sglang-deps, below) must load against this torch.
  .venv/bin/python -m pip install -q numpy pytest scikit-build-core nanobind torch==2.15.0 \
    transformers==5.24.0 matplotlib==3.11.2
  # ggml-python builds ggml (the CPU flash attention llama.cpp runs) for this CPU: the peer of
  # bench/ggml_fa.py. Optional: without it that comparison and its smoke test say so and skip.
  .venv/bin/python -m pip install -q --no-build-isolation ggml-python==0.0.45 ||
    echo "setup: ggml-python did not install; bench/ggml_fa.py will have no peer to run" >&2
  install_ring_flash_attn_deps
  install_sglang_test_deps
  echo "setup: building and installing the anyattn Python package into .venv"
  # One retry: scikit-build-core gives up on CMake ("Accessing CMake timed out", then "Could not
  # find CMake") when `cmake -E capabilities` takes over its 5 s timeout, which happened once on
  # the development VM right after a long benchmark. A real build error fails both times.
  if ! .venv/bin/python -m pip install -q --no-build-isolation --no-deps .; then
    echo "setup: the package build failed; retrying once" >&2
    .venv/bin/python -m pip install -q --no-build-isolation --no-deps .
  fi
}

# The Rust crates need a toolchain new enough for candle-core (rust-version 1.82 in rust/). It
# comes with this kind of machine (rustup); Debian's own rustc is too old, so say so plainly.
# The AArch64 stage cross-compiles the crates too (scripts/test_aarch64_rust.sh): rustup adds that
# target's standard library once.
check_rust_toolchain() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; the Rust tests need a Rust toolchain >= 1.82 (rustup)" >&2
    exit 1
  fi
  if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
  fi
}

install_system_packages
if [ "${1:-}" = "--python" ]; then
  install_python_environment
  check_rust_toolchain
fi
