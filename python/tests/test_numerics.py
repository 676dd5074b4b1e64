"""Numerics of flash_attn_func against the float64 reference, by flash-attn's 2x rule.

For every (framework, dtype) and feature, a few shapes: head dims from {32, 59, 64, 96, 128, 256},
seqlen pairs with Sq < Sk, Sq > Sk and Sq = Sk, GQA ratios. Both out and LSE are checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from conftest import FRAMEWORK_DTYPES, make_inputs, to_numpy
from reference import attention_ref, check_2x, lse_eps, out_eps

# (D, Dv, Sq, Sk, Hq, Hk)
SHAPES = [
    (32, 32, 1, 1, 2, 2),
    (59, 59, 7, 63, 4, 2),
    (64, 64, 64, 65, 4, 4),
    (96, 96, 113, 203, 8, 2),
    (128, 128, 128, 128, 2, 1),
    (256, 256, 257, 100, 2, 2),
    (64, 40, 65, 7, 4, 1),
]

FEATURES = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window_size": (16, 3)},
    "causal_window": {"causal": True, "window_size": (9, -1)},
    "softcap": {"softcap": 3.0},
    "alibi": {"alibi": "per_head"},
    "alibi_batched": {"alibi": "batched", "causal": True},
    "sinks": {"sinks": True},
    "scale": {"softmax_scale": 0.37},
    "all": {"causal": True, "window_size": (20, -1), "softcap": 5.0, "alibi": "per_head",
            "sinks": True},
}


def _cases():
    cases = []
    for fi, feature in enumerate(FEATURES):
        for di, (framework, dtype) in enumerate(FRAMEWORK_DTYPES):
            for j in range(2):
                shape = SHAPES[(fi * 3 + di * 2 + j * 5) % len(SHAPES)]
                cases.append(pytest.param(framework, dtype, feature, shape,
                                          id=f"{framework}-{dtype}-{feature}-{'x'.join(map(str, shape))}"))
    return cases


def _extras(framework, b, hq, spec, rng):
    """alibi slopes and sinks for the feature spec, native and as numpy."""
    alibi = sinks = None
    if spec.get("alibi") == "per_head":
        alibi = rng.uniform(0.01, 0.5, size=(hq,)).astype(np.float32)
    elif spec.get("alibi") == "batched":
        alibi = rng.uniform(0.01, 0.5, size=(b, hq)).astype(np.float32)
    if spec.get("sinks"):
        sinks = rng.uniform(-2.0, 3.0, size=(hq,)).astype(np.float32)
    if framework == "torch":
        import torch

        native = [None if x is None else torch.from_numpy(x) for x in (alibi, sinks)]
    else:
        native = [alibi, sinks]
    return native, (alibi, sinks)


@pytest.mark.parametrize("framework,dtype,feature,shape", _cases())
def test_dense_forward_2x_rule(framework, dtype, feature, shape):
    d, dv, sq, sk, hq, hk = shape
    b = 2
    spec = FEATURES[feature]
    (q, k, v), (q64, k64, v64) = make_inputs(
        framework, dtype, [(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, dv)], seed=sum(shape))
    rng = np.random.default_rng(7)
    (alibi, sinks), (alibi_np, sinks_np) = _extras(framework, b, hq, spec, rng)
    kwargs = {key: spec[key] for key in ("causal", "window_size", "softcap", "softmax_scale")
              if key in spec}
    out, lse, s_dmask = anyattn.flash_attn_func(q, k, v, alibi_slopes=alibi, sinks=sinks,
                                                return_attn_probs=True, **kwargs)
    assert tuple(s_dmask.shape) == (0,)  # flash-attn's S_dmask without dropout
    assert tuple(out.shape) == (b, sq, hq, dv) and out.dtype == q.dtype
    assert tuple(lse.shape) == (b, hq, sq)
    assert type(out) is type(q)

    ref_kwargs = dict(softmax_scale=kwargs.get("softmax_scale"), causal=kwargs.get("causal", False),
                      window=kwargs.get("window_size", (-1, -1)), softcap=kwargs.get("softcap", 0.0),
                      alibi=alibi_np, sinks=sinks_np)
    ref_out, ref_lse = attention_ref(q64, k64, v64, **ref_kwargs)
    naive_out, naive_lse = attention_ref(q64, k64, v64, dtype=dtype, **ref_kwargs)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


@pytest.mark.parametrize("feature", ["plain", "causal", "all"])
def test_fast_precision_from_the_environment_keeps_the_2x_rule(monkeypatch, feature):
    """ANYATTN_PRECISION=fast, which the library reads at each call: bf16 calls may round P to
    bf16 before P V (flash-attn's CUDA kernels do), and the 2x rule still holds."""
    pytest.importorskip("torch")
    d, dv, sq, sk, hq, hk = 128, 128, 130, 131, 8, 2
    b = 1
    spec = FEATURES[feature]
    (q, k, v), (q64, k64, v64) = make_inputs(
        "torch", "bfloat16", [(b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, dv)], seed=5)
    (alibi, sinks), (alibi_np, sinks_np) = _extras("torch", b, hq, spec, np.random.default_rng(3))
    kwargs = {key: spec[key] for key in ("causal", "window_size", "softcap") if key in spec}
    monkeypatch.setenv("ANYATTN_PRECISION", "fast")
    out, lse, _ = anyattn.flash_attn_func(q, k, v, alibi_slopes=alibi, sinks=sinks,
                                          return_attn_probs=True, **kwargs)
    ref_kwargs = dict(causal=kwargs.get("causal", False),
                      window=kwargs.get("window_size", (-1, -1)),
                      softcap=kwargs.get("softcap", 0.0), alibi=alibi_np, sinks=sinks_np)
    ref_out, ref_lse = attention_ref(q64, k64, v64, **ref_kwargs)
    naive_out, naive_lse = attention_ref(q64, k64, v64, dtype="bfloat16", **ref_kwargs)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps("bfloat16", ref_out))
    check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


def test_unknown_precision_in_the_environment_is_a_value_error(monkeypatch):
    (q, k, v), _ = make_inputs("numpy", "float32", [(1, 4, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8)], 1)
    monkeypatch.setenv("ANYATTN_PRECISION", "fastest")
    with pytest.raises(ValueError, match='ANYATTN_PRECISION is "fastest"'):
        anyattn.flash_attn_func(q, k, v)


@pytest.mark.parametrize("framework,dtype", FRAMEWORK_DTYPES)
def test_fully_masked_rows_are_zero_with_lse_minus_inf_or_sink(framework, dtype):
    b, sq, sk, h, d = 1, 6, 3, 2, 16
    (q, k, v), _ = make_inputs(framework, dtype, [(b, sq, h, d), (b, sk, h, d), (b, sk, h, d)], 3)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out, lse = to_numpy(out), to_numpy(lse)
    # causal, Sq > Sk: query i sees keys j <= i - 3, so rows 0..2 see nothing
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(out[:, 3:])) and np.all(np.isfinite(lse[:, :, 3:]))
    sinks_np = np.array([0.25, -1.5], np.float32)
    sinks = sinks_np if framework == "numpy" else __import__("torch").from_numpy(sinks_np)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=True, sinks=sinks, return_attn_probs=True)
    out, lse = to_numpy(out), to_numpy(lse)
    assert np.all(out[:, :3] == 0)
    np.testing.assert_array_equal(lse[0, :, :3], np.repeat(sinks_np[:, None], 3, axis=1))


def test_explicit_zero_scale_means_uniform_attention():
    (q, k, v), (_, _, v64) = make_inputs("numpy", "float32", [(1, 4, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8)], 1)
    out = anyattn.flash_attn_func(q, k, v, softmax_scale=0.0)
    np.testing.assert_allclose(out, np.broadcast_to(v64.mean(axis=1, keepdims=True), out.shape),
                               rtol=1e-6, atol=1e-6)
    default = anyattn.flash_attn_func(q, k, v)
    assert not np.allclose(out, default)


def test_zero_scale_propagates_nan_from_q_rows_only():
    (q, k, v), _ = make_inputs("numpy", "float32", [(1, 3, 1, 8), (1, 4, 1, 8), (1, 4, 1, 8)], 2)
    q[0, 1, 0, 2] = np.inf
    out = anyattn.flash_attn_func(q, k, v, softmax_scale=0.0)
    assert np.all(np.isnan(out[0, 1])) and np.all(np.isfinite(out[0, [0, 2]]))


def test_threads_do_not_change_bits():
    (q, k, v), _ = make_inputs("numpy", "float32", [(2, 200, 4, 64), (2, 300, 2, 64), (2, 300, 2, 64)], 4)
    before = anyattn.get_num_threads()
    try:
        anyattn.set_num_threads(1)
        assert anyattn.get_num_threads() == 1
        one = anyattn.flash_attn_func(q, k, v, causal=True)
        anyattn.set_num_threads(3)
        three = anyattn.flash_attn_func(q, k, v, causal=True)
    finally:
        anyattn.set_num_threads(before)
    np.testing.assert_array_equal(one, three)
