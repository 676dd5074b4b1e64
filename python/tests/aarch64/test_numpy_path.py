"""The numpy path on the machine that runs it, against the float64 reference (reference.py).

scripts/test_aarch64_python.sh runs this file under qemu-aarch64, with the extension
cross-compiled for AArch64 and torch unimportable; the host's pytest run collects it too. Each
case checks the output and the LSE twice: by flash-attn's 2x rule against the same-dtype naive
computation (as test_numerics.py does), and against a fixed bound for the dtype, relative to the
largest reference value. The cases cover f32 and f16, causal (also with fully masked rows),
GQA, a sliding window, softcap, ALiBi with sinks, head dims 64 and 80, varlen and a KV-cache
decode.
"""

from __future__ import annotations

import os
import platform
import sys

import numpy as np
import pytest

import anyattn
from conftest import make_inputs
from reference import attention_ref, check_2x, lse_eps, max_err, out_eps

# max |got - reference| <= bound * max(1, max |reference|): the dtype's rounding of the output
# (f16: 2^-11) with room for accumulation; the LSE is float32 for both input dtypes.
OUT_BOUND = {"float32": 1e-5, "float16": 2e-3}
LSE_BOUND = 1e-5

# name -> (D, Sq, Sk, Hq, Hk, flash_attn_func keywords)
CASES = {
    "plain": (64, 33, 47, 4, 2, {}),
    "causal": (64, 33, 47, 4, 2, {"causal": True}),
    "causal_more_queries": (64, 50, 37, 4, 2, {"causal": True}),
    "window": (64, 41, 41, 4, 2, {"window_size": (8, 3)}),
    "softcap": (64, 29, 61, 4, 4, {"softcap": 4.0}),
    "d80_causal_window": (80, 45, 70, 4, 2, {"causal": True, "window_size": (16, -1)}),
    "alibi_sinks": (80, 17, 33, 4, 1, {"alibi": True, "sinks": True, "softmax_scale": 0.2}),
}
DTYPES = ["float32", "float16"]


def _bounded(name: str, got, ref, bound: float) -> None:
    limit = bound * max(1.0, float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0)))
    err = max_err(got, ref)
    assert err <= limit, f"{name}: max error {err:.3g} > {limit:.3g}"


def _check(dtype, out, lse, q64, k64, v64, **ref_kwargs):
    """out and lse against the float64 reference, by the 2x rule and by the fixed bounds."""
    ref_out, ref_lse = attention_ref(q64, k64, v64, **ref_kwargs)
    naive_out, naive_lse = attention_ref(q64, k64, v64, dtype=dtype, **ref_kwargs)
    check_2x("out", out, ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", lse, ref_lse, naive_lse, lse_eps(ref_lse))
    _bounded("out", out, ref_out, OUT_BOUND[dtype])
    _bounded("lse", lse, ref_lse, LSE_BOUND)


def test_dispatch_picks_the_native_path():
    if "ANYATTN_ISA" in os.environ:
        pytest.skip("ANYATTN_ISA forces a path")
    if platform.machine() == "aarch64":
        assert anyattn.isa() == "neon"
        assert anyattn._core.__file__.endswith(".cpython-311-aarch64-linux-gnu.so")
    else:
        assert anyattn.isa() in ("avx512_amx", "avx512", "avx2")
    if sys.modules.get("torch") is None:
        info = anyattn.backends()
        assert info["numpy"]["backend"] == "anyattn" and info["numpy"]["isa"] == anyattn.isa()
        assert info["cpu"]["backend"] == "unavailable"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_dense(case, dtype):
    d, sq, sk, hq, hk, spec = CASES[case]
    b = 2
    (q, k, v), (q64, k64, v64) = make_inputs(
        "numpy", dtype, [(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)], seed=sq * sk + d)
    rng = np.random.default_rng(5)
    alibi = rng.uniform(0.01, 0.5, size=(hq,)).astype(np.float32) if spec.get("alibi") else None
    sinks = rng.uniform(-2.0, 3.0, size=(hq,)).astype(np.float32) if spec.get("sinks") else None
    kwargs = {key: spec[key] for key in ("causal", "window_size", "softcap", "softmax_scale")
              if key in spec}
    out, lse, s_dmask = anyattn.flash_attn_func(q, k, v, alibi_slopes=alibi, sinks=sinks,
                                                return_attn_probs=True, **kwargs)
    assert isinstance(out, np.ndarray) and out.dtype == q.dtype and out.shape == (b, sq, hq, d)
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq) and s_dmask.shape == (0,)
    _check(dtype, out, lse, q64, k64, v64, softmax_scale=kwargs.get("softmax_scale"),
           causal=kwargs.get("causal", False), window=kwargs.get("window_size", (-1, -1)),
           softcap=kwargs.get("softcap", 0.0), alibi=alibi, sinks=sinks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_causal_gqa(dtype):
    """Three packed sequences (one with more queries than keys), each checked on its own."""
    lens_q, lens_k = [5, 31, 12], [9, 44, 7]
    hq, hk, d = 4, 2, 64
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    (q, k, v), (q64, k64, v64) = make_inputs(
        "numpy", dtype, [(cu_q[-1], hq, d), (cu_k[-1], hk, d), (cu_k[-1], hk, d)], seed=11)
    out, lse, _ = anyattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                 causal=True, return_attn_probs=True)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (hq, cu_q[-1])
    for i in range(len(lens_q)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        _check(dtype, out[None, rows], lse[None, :, rows], q64[None, rows], k64[None, keys],
               v64[None, keys], causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_decode(dtype):
    """One query row per sequence against the first cache_seqlens[b] keys of a cache (the decode
    kernels)."""
    b, cache_len, hq, hk, d = 2, 40, 4, 2, 80
    seqlens = np.array([17, 40], np.int32)
    (q, k_cache, v_cache), (q64, k64, v64) = make_inputs(
        "numpy", dtype, [(b, 1, hq, d), (b, cache_len, hk, d), (b, cache_len, hk, d)], seed=3)
    out, lse = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               causal=True, return_softmax_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (b, hq, 1)
    for i, n in enumerate(seqlens):
        _check(dtype, out[i:i + 1], lse[i:i + 1], q64[i:i + 1], k64[i:i + 1, :n],
               v64[i:i + 1, :n], causal=True)
