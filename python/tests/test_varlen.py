"""flash_attn_varlen_func and its packed forms: each sequence equals dense attention on its slice."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from conftest import FRAMEWORK_DTYPES, make_inputs, to_numpy
from reference import attention_ref, check_2x, lse_eps, out_eps

LENS_Q = [5, 0, 17, 1, 33]
LENS_K = [9, 4, 17, 12, 33]


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _per_sequence_ref(q64, k64, v64, lens_q, lens_k, dtype, **kw):
    """(out (total_q, Hq, Dv), lse (Hq, total_q)) from dense attention_ref on each sequence."""
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    hq = q64.shape[1]
    out = np.zeros((q64.shape[0], hq, v64.shape[-1]))
    lse = np.zeros((hq, q64.shape[0]))
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alibi = kw.get("alibi")
        kwb = dict(kw, alibi=None if alibi is None else np.asarray(alibi)[b] if np.ndim(alibi) == 2 else alibi)
        o, l = attention_ref(q64[None, sq], k64[None, sk], v64[None, sk], dtype=dtype, **kwb)
        out[sq], lse[:, sq] = o[0], l[0]
    return out, lse


FEATURES = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window_size": (4, 2)},
    "softcap_alibi_sinks": {"softcap": 2.0, "alibi": True, "sinks": True, "causal": True},
}


@pytest.mark.parametrize("framework,dtype", FRAMEWORK_DTYPES)
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_varlen_equals_dense_per_sequence(framework, dtype, feature):
    spec = FEATURES[feature]
    hq, hk, d = 4, 2, 32
    (q, k, v), (q64, k64, v64) = make_inputs(
        framework, dtype, [(sum(LENS_Q), hq, d), (sum(LENS_K), hk, d), (sum(LENS_K), hk, d)], 3)
    rng = np.random.default_rng(1)
    alibi = rng.uniform(0.1, 1.0, (len(LENS_Q), hq)).astype(np.float32) if spec.get("alibi") else None
    sinks = rng.standard_normal(hq).astype(np.float32) if spec.get("sinks") else None
    cu_q, cu_k = _cu(LENS_Q), _cu(LENS_K)
    if framework == "torch":
        import torch
        cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)
        alibi = None if alibi is None else torch.from_numpy(alibi)
        sinks = None if sinks is None else torch.from_numpy(sinks)
    kw = {key: spec[key] for key in ("causal", "window_size", "softcap") if key in spec}
    out, lse, s_dmask = anyattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), alibi_slopes=alibi, sinks=sinks,
        return_attn_probs=True, **kw)
    assert tuple(s_dmask.shape) == (0,) and type(out) is type(q) and out.dtype == q.dtype
    assert tuple(out.shape) == (sum(LENS_Q), hq, d) and tuple(lse.shape) == (hq, sum(LENS_Q))
    ref_kw = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi=None if alibi is None else to_numpy(alibi),
                  sinks=None if sinks is None else to_numpy(sinks))
    ref_out, ref_lse = _per_sequence_ref(q64, k64, v64, LENS_Q, LENS_K, None, **ref_kw)
    naive_out, naive_lse = _per_sequence_ref(q64, k64, v64, LENS_Q, LENS_K, dtype, **ref_kw)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


def test_packed_forms_are_views_of_the_same_call():
    rng = np.random.default_rng(0)
    lens = [3, 8, 5]
    qkv = rng.standard_normal((sum(lens), 3, 2, 16)).astype(np.float32)
    cu = _cu(lens)
    ref = anyattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 8, 8, causal=True)
    packed = anyattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 8, causal=True)
    kv = anyattn.flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], cu, cu, 8, 8, causal=True)
    np.testing.assert_array_equal(packed, ref)
    np.testing.assert_array_equal(kv, ref)


def test_seqused_k_limits_the_keys():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 2, 8)).astype(np.float32)
    k = rng.standard_normal((10, 2, 8)).astype(np.float32)
    cu_q, cu_k = _cu([3, 3]), _cu([5, 5])
    out = anyattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 5, seqused_k=np.array([2, 5], np.int32))
    first = anyattn.flash_attn_func(q[None, :3], k[None, :2], k[None, :2])[0]
    np.testing.assert_allclose(out[:3], first, rtol=1e-6, atol=1e-6)


def test_bad_cu_seqlens_raise_value_error_naming_it():
    q = np.zeros((8, 2, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens_q.*non-decreasing"):
        anyattn.flash_attn_varlen_func(q, q, q, np.array([0, 5, 3, 8], np.int32), _cu([3, 3, 2]), 8, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k\\[1\\] is 9"):
        anyattn.flash_attn_varlen_func(q, q, q, _cu([8]), np.array([0, 9], np.int32), 8, 9)


def test_torch_op_traces_with_fake_tensors():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(10, 4, 16)
        cu = torch.tensor([0, 4, 10], dtype=torch.int32)
        out, lse = torch.ops.anyattn.fwd_varlen(q, q[:, :2], q[:, :2, :8], cu, cu, None, 6, 6, 0.0, 0.0,
                                                True, -1, -1, None, None)
        assert out.shape == (10, 4, 8) and lse.shape == (4, 10) and lse.dtype == torch.float32


def test_device_route_slices_the_same_sequences():
    """The off-CPU path (one attention over the packed rows under a block-diagonal mask) run on
    CPU tensors agrees with the varlen kernel, seqused_k included, so its mask selects the keys
    the kernel reads."""
    torch = pytest.importorskip("torch")
    from anyattn import varlen
    from anyattn._options import make_options

    rng = np.random.default_rng(6)
    q, k, v = (torch.from_numpy(rng.standard_normal((sum(lens), 2, 16)).astype(np.float32))
               for lens in (LENS_Q, LENS_K, LENS_K))
    cu_q, cu_k = torch.from_numpy(_cu(LENS_Q)), torch.from_numpy(_cu(LENS_K))
    used = torch.tensor([min(n, 6) for n in LENS_K], dtype=torch.int32)
    options = make_options(0.0, None, True, (-1, -1), 0.0, False)
    out, lse = varlen.varlen_on_device(q, k, v, cu_q, cu_k, used, max(LENS_Q),
                                               max(LENS_K), options, None, None)
    ref, ref_lse, _ = anyattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K),
                                                     causal=True, seqused_k=used,
                                                     return_attn_probs=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
