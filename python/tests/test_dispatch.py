"""Device dispatch: the pure decision function, and the SDPA / math fallbacks run on CPU tensors
against anyattn's kernels (the fallbacks serve CUDA-without-flash_attn, mps, xpu, ...)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from anyattn import _dispatch
from anyattn._dispatch import ANYATTN, FLASH_ATTN, MATH, SDPA, CallFeatures, Environment, select_backend

HALF = CallFeatures(dtype="bfloat16", head_dim=128, head_dim_v=128)
GOOD_ENV = Environment(flash_attn_version="2.7.4.post1", cuda_capability=(9, 0))


@pytest.mark.parametrize(
    "device,call,env,backend,why",
    [
        ("cpu", HALF, GOOD_ENV, ANYATTN, "anyattn"),
        ("cpu", HALF._replace(softcap=True, sinks=True), Environment(), ANYATTN, "anyattn"),
        ("cuda", HALF, GOOD_ENV, FLASH_ATTN, "2.7.4"),
        ("cuda", HALF._replace(softcap=True, alibi=True, window=True, dropout=True), GOOD_ENV, FLASH_ATTN, "supports"),
        ("cuda", HALF, Environment(cuda_capability=(9, 0)), SDPA, "not installed"),
        ("cuda", HALF, GOOD_ENV._replace(cuda_capability=(7, 5)), SDPA, "capability"),
        ("cuda", HALF._replace(dtype="float32"), GOOD_ENV, SDPA, "float16/bfloat16 only"),
        ("cuda", HALF._replace(head_dim_v=64), GOOD_ENV, SDPA, "equal q/v head dims"),
        ("cuda", HALF._replace(sinks=True), GOOD_ENV, MATH, "no attention sinks"),
        ("cuda", HALF._replace(sinks=True, dtype="float32"), GOOD_ENV, SDPA, "float16/bfloat16"),
        ("cuda", HALF._replace(softcap=True), GOOD_ENV._replace(flash_attn_version="2.5.9"), MATH, "lacks softcap"),
        ("cuda", HALF._replace(window=True), GOOD_ENV._replace(flash_attn_version="2.2.0"), SDPA, "lacks window_size"),
        ("cuda", HALF._replace(alibi=True), GOOD_ENV._replace(flash_attn_version="2.3.6"), MATH, "lacks alibi_slopes"),
        ("cuda", HALF._replace(return_lse=True), Environment(), MATH, "no LSE"),
        ("mps", HALF, GOOD_ENV, SDPA, "no kernels for device 'mps'"),
        ("xpu", HALF._replace(softcap=True), GOOD_ENV, MATH, "softcap is not expressible"),
        ("mps", HALF._replace(dtype="float32", alibi=True, sinks=True), Environment(), SDPA, "bottom-right"),
    ],
)
def test_select_backend(device, call, env, backend, why):
    choice = select_backend(device, call, env)
    assert choice.backend == backend, choice
    assert why in choice.reason


def test_fallback_is_logged_once_at_debug(caplog):
    choice = select_backend("mps", HALF, Environment())
    _dispatch._LOGGED.discard(("mps", choice.backend, choice.reason))
    with caplog.at_level(logging.DEBUG, logger="anyattn"):
        _dispatch.log_fallback_once("mps", choice)
        _dispatch.log_fallback_once("mps", choice)
    records = [r for r in caplog.records if r.name == "anyattn"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert "sdpa" in records[0].getMessage()


torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _sdpa  # noqa: E402
from anyattn._options import make_options  # noqa: E402
from conftest import make_inputs, to_numpy  # noqa: E402
from reference import attention_ref, check_2x, lse_eps, out_eps  # noqa: E402

FALLBACK_CASES = {
    "causal_sq_lt_sk": dict(shape=(5, 9), causal=True),
    "causal_sq_gt_sk": dict(shape=(9, 4), causal=True),  # rows 0..4 fully masked
    "window": dict(shape=(20, 30), window=(4, 2)),
    "alibi": dict(shape=(12, 17), alibi=True, causal=True),
    "sinks": dict(shape=(9, 4), sinks=True, causal=True),
    "softcap": dict(shape=(8, 8), softcap=2.5, window=(3, 0)),
    "everything": dict(shape=(10, 13), softcap=4.0, alibi=True, sinks=True, window=(5, 1)),
}


@pytest.mark.parametrize("route", ["sdpa", "math"])
@pytest.mark.parametrize("case", list(FALLBACK_CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fallbacks_match_reference_and_anyattn(route, case, dtype):
    spec = FALLBACK_CASES[case]
    sq, sk = spec["shape"]
    options = make_options(0.0, None, spec.get("causal", False), spec.get("window", (-1, -1)),
                           spec.get("softcap", 0.0), False)
    has_alibi, has_sinks = spec.get("alibi", False), spec.get("sinks", False)
    tdtype = getattr(torch, dtype)
    if route == "sdpa" and _sdpa.needs_math(options, tdtype, has_alibi, has_sinks, False):
        pytest.skip("SDPA cannot express this call exactly; the dispatcher sends it to the math path")
    (q, k, v), (q64, k64, v64) = make_inputs("torch", dtype, [(2, sq, 4, 32), (2, sk, 2, 32), (2, sk, 2, 32)], sq * sk)
    alibi = torch.linspace(0.05, 0.6, 4) if has_alibi else None
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if has_sinks else None
    if route == "sdpa":
        out, lse = _sdpa.sdpa_attention(q, k, v, options, alibi, sinks), None
    else:
        out, lse = _sdpa.math_attention(q, k, v, options, alibi, sinks)
    assert out.dtype == q.dtype and tuple(out.shape) == (2, sq, 4, 32)
    np_extra = dict(alibi=None if alibi is None else alibi.numpy(), sinks=None if sinks is None else sinks.numpy())
    ref_kw = dict(causal=options.causal, window=options.window_size, softcap=options.softcap, **np_extra)
    ref_out, ref_lse = attention_ref(q64, k64, v64, **ref_kw)
    naive_out, naive_lse = attention_ref(q64, k64, v64, dtype=dtype, **ref_kw)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    if lse is not None:
        check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))
    native = anyattn.flash_attn_func(q, k, v, causal=options.causal, window_size=options.window_size,
                                     softcap=options.softcap, alibi_slopes=alibi, sinks=sinks)
    assert torch.isfinite(out).all()
    # Both are within 2x of the naive error of the reference, so within 4x of each other.
    assert float((out.double() - native.double()).abs().max()) <= 4 * max(
        float(np.abs(naive_out - ref_out).max()), out_eps(dtype, ref_out)) + 1e-12


def test_device_route_on_meta_tensors_keeps_shapes():
    q = torch.empty(1, 5, 4, 16, device="meta")
    k = torch.empty(1, 7, 2, 16, device="meta")
    out = anyattn.flash_attn_func(q, k, k, causal=True)
    assert out.device.type == "meta" and tuple(out.shape) == (1, 5, 4, 16)
    out, lse, s_dmask = anyattn.flash_attn_func(q, k, k, softcap=1.0, return_attn_probs=True)
    assert tuple(lse.shape) == (1, 4, 5) and tuple(s_dmask.shape) == (0,)


def test_backends_reports_every_device():
    info = anyattn.backends()
    assert info["numpy"]["backend"] == "anyattn" and info["cpu"]["backend"] == "anyattn"
    assert info["cpu"]["isa"] in ("avx512_amx", "avx512", "avx2", "neon", "portable")
    assert int(info["cpu"]["threads"]) == anyattn.get_num_threads()
    expected_cuda = "flash_attn" if _dispatch.flash_attn_version() else "sdpa"
    assert info["cuda"]["backend"] == expected_cuda
    assert info["other"]["backend"] == "sdpa"
    assert all(entry["reason"] for entry in info.values())


@pytest.mark.parametrize("sq", [0, 1, 4, 9])
@pytest.mark.parametrize("sk", [0, 1, 4, 9])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 0), (0, 3), (1, -1), (-1, 2)])
def test_has_empty_rows_matches_the_mask(sq, sk, window):
    mask = _sdpa.visible_mask(sq, sk, window, "cpu")
    assert _sdpa.has_empty_rows(sq, sk, window) == bool((~mask.any(dim=1)).any())
