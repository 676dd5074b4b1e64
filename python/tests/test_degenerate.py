"""Empty and degenerate tensors on every entry point (docs/semantics.md, section 6), numpy and torch:
a batch, query length, head count or head dim of 0, keys of length 0, empty arrays with all strides
0, autograd through them, and the torch.compile fake kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest

import anyattn

torch = pytest.importorskip("torch")

FRAMEWORKS = ["numpy", "torch"]


def _arr(framework, shape, seed=0, dtype=np.float32):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return x if framework == "numpy" else torch.from_numpy(x)


def _np(x):
    return x if isinstance(x, np.ndarray) else x.detach().numpy()


def _i32(framework, values):
    x = np.asarray(values, np.int32)
    return x if framework == "numpy" else torch.from_numpy(x)


def _zero_strided(framework, shape):
    """An empty array whose strides are all 0, as numpy makes them."""
    if framework == "numpy":
        return np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape, (0,) * len(shape))
    return torch.zeros(1).as_strided(shape, (0,) * len(shape))


def _zero_score_ref(v, sq, hq, causal=False):
    """(out, lse) of attention whose scores are all 0 (D = 0): v (B, Sk, Hk, Dv) as numpy."""
    b, sk, hk, dv = v.shape
    out = np.zeros((b, sq, hq, dv))
    lse = np.full((b, hq, sq), -np.inf)
    for i in range(sq):
        last = i + sk - sq if causal else sk - 1
        if last < 0:
            continue
        mean = v[:, : last + 1].astype(np.float64).mean(axis=1)  # (B, Hk, Dv)
        out[:, i] = np.repeat(mean, hq // hk, axis=1)
        lse[:, :, i] = math.log(last + 1)
    return out, lse


# ---- Dense forward ----------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "q_shape,k_shape,dv",
    [
        ((0, 3, 2, 8), (0, 4, 1, 8), 8),  # B = 0
        ((2, 0, 2, 8), (2, 4, 1, 8), 8),  # Sq = 0
        ((2, 3, 0, 8), (2, 4, 0, 8), 8),  # Hq = Hk = 0
        ((2, 3, 0, 8), (2, 4, 2, 8), 8),  # Hq = 0 over Hk > 0
        ((2, 3, 2, 8), (2, 4, 1, 8), 0),  # Dv = 0
        ((2, 3, 2, 0), (2, 4, 1, 0), 0),  # D = Dv = 0
    ],
)
def test_dense_empty_outputs(framework, q_shape, k_shape, dv):
    q = _arr(framework, q_shape, 1)
    k = _arr(framework, k_shape, 2)
    v = _arr(framework, k_shape[:3] + (dv,), 3)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    b, sq, hq, _ = q_shape
    assert tuple(out.shape) == (b, sq, hq, dv)
    assert tuple(lse.shape) == (b, hq, sq)
    assert np.isfinite(_np(lse)).all()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_dense_no_keys_gives_zero_and_minus_inf(framework):
    q, k = _arr(framework, (2, 3, 2, 8), 1), _arr(framework, (2, 0, 1, 8), 2)
    out, lse, _ = anyattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert (_np(out) == 0).all() and (_np(lse) == -np.inf).all()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_no_key_heads_for_query_heads_is_an_error(framework):
    q, k = _arr(framework, (2, 3, 2, 8), 1), _arr(framework, (2, 4, 0, 8), 2)
    with pytest.raises(ValueError, match=r"nheads_k is 0 .*no key/value heads"):
        anyattn.flash_attn_func(q, k, k)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_head_dim_zero(framework, causal):
    q, k = _arr(framework, (2, 3, 4, 0), 1), _arr(framework, (2, 5, 2, 0), 2)
    v = _arr(framework, (2, 5, 2, 6), 3)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=causal, softcap=3.0,
                                          return_attn_probs=True)
    want_out, want_lse = _zero_score_ref(_np(v), 3, 4, causal)
    np.testing.assert_allclose(_np(out), want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(lse), want_lse, rtol=1e-6)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_zero_strided_empty_arrays(framework):
    z = _zero_strided(framework, (0, 4, 2, 8))
    assert tuple(anyattn.flash_attn_func(z, z, z).shape) == (0, 4, 2, 8)
    zq = _zero_strided(framework, (0, 2, 8))
    cu = _i32(framework, [0])
    out = anyattn.flash_attn_varlen_func(zq, zq, zq, cu, cu, 0, 0)
    assert tuple(out.shape) == (0, 2, 8)
    cache = _zero_strided(framework, (0, 16, 2, 8))
    assert tuple(anyattn.flash_attn_with_kvcache(z, cache, cache).shape) == (0, 4, 2, 8)
    lse = _zero_strided(framework, (2, 0))
    out, lse_out = anyattn.merge_attention_states(zq, lse, zq, lse)
    assert tuple(out.shape) == (0, 2, 8) and tuple(lse_out.shape) == (2, 0)


# ---- Varlen -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "cu_q,cu_k,hq,hk,d,dv",
    [
        ([0], [0], 2, 1, 8, 8),  # B = 0
        ([0, 0, 0], [0, 3, 5], 2, 1, 8, 8),  # total_q = 0
        ([0, 2, 3], [0, 0, 0], 2, 1, 8, 8),  # total_k = 0
        ([0, 2, 3], [0, 4, 5], 0, 0, 8, 8),  # no heads
        ([0, 2, 2, 4], [0, 3, 5, 5], 2, 1, 8, 0),  # Dv = 0, empty sequences
    ],
)
def test_varlen_empty(framework, cu_q, cu_k, hq, hk, d, dv):
    q = _arr(framework, (cu_q[-1], hq, d), 1)
    k = _arr(framework, (cu_k[-1], hk, d), 2)
    v = _arr(framework, (cu_k[-1], hk, dv), 3)
    lens_q, lens_k = np.diff(cu_q), np.diff(cu_k)
    out, lse, _ = anyattn.flash_attn_varlen_func(
        q, k, v, _i32(framework, cu_q), _i32(framework, cu_k), int(max(lens_q, default=0)),
        int(max(lens_k, default=0)), causal=True, return_attn_probs=True)
    assert tuple(out.shape) == (cu_q[-1], hq, dv)
    assert tuple(lse.shape) == (hq, cu_q[-1])
    if cu_k[-1] == 0:
        assert (_np(out) == 0).all() and (_np(lse) == -np.inf).all()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_varlen_head_dim_zero(framework):
    cu_q, cu_k = [0, 3, 3, 5], [0, 5, 7, 7]
    q, k = _arr(framework, (5, 4, 0), 1), _arr(framework, (7, 2, 0), 2)
    v = _arr(framework, (7, 2, 6), 3)
    out, lse, _ = anyattn.flash_attn_varlen_func(
        q, k, v, _i32(framework, cu_q), _i32(framework, cu_k), 3, 5, causal=True,
        return_attn_probs=True)
    want_out, want_lse = _zero_score_ref(_np(v)[None, :5], 3, 4, causal=True)
    np.testing.assert_allclose(_np(out)[:3], want_out[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(lse)[:, :3], want_lse[0], rtol=1e-6)
    assert (_np(out)[3:] == 0).all() and (_np(lse)[:, 3:] == -np.inf).all()  # no keys


# ---- KV cache ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "b,sq,hq,hk,s_cache,d,dv",
    [
        (0, 1, 2, 1, 16, 8, 8),
        (2, 0, 2, 1, 16, 8, 8),
        (2, 1, 0, 0, 16, 8, 8),
        (2, 3, 2, 1, 0, 8, 8),  # a cache of 0 positions: no keys
        (2, 3, 2, 1, 6, 0, 4),
        (2, 3, 2, 1, 6, 4, 0),
    ],
)
def test_kvcache_empty(framework, b, sq, hq, hk, s_cache, d, dv):
    q = _arr(framework, (b, sq, hq, d), 1)
    k_cache = _arr(framework, (b, s_cache, hk, d), 2)
    v_cache = _arr(framework, (b, s_cache, hk, dv), 3)
    out, lse = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True,
                                               return_softmax_lse=True)
    assert tuple(out.shape) == (b, sq, hq, dv) and tuple(lse.shape) == (b, hq, sq)
    if s_cache == 0:
        assert (_np(out) == 0).all() and (_np(lse) == -np.inf).all()
    if d == 0:
        want_out, want_lse = _zero_score_ref(_np(v_cache), sq, hq, causal=True)
        np.testing.assert_allclose(_np(out), want_out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_np(lse), want_lse, rtol=1e-6)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_kvcache_append_without_queries(framework):
    q = _arr(framework, (2, 0, 2, 8), 1)
    k_cache, v_cache = _arr(framework, (2, 6, 1, 8), 2) * 0, _arr(framework, (2, 6, 1, 8), 3) * 0
    k_new, v_new = _arr(framework, (2, 2, 1, 8), 4), _arr(framework, (2, 2, 1, 8), 5)
    seqlens = _i32(framework, [1, 3])
    out = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens)
    assert tuple(out.shape) == (2, 0, 2, 8)
    np.testing.assert_array_equal(_np(k_cache)[0, 1:3], _np(k_new)[0])
    np.testing.assert_array_equal(_np(v_cache)[1, 3:5], _np(v_new)[1])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_paged_without_blocks(framework):
    """A paged cache of 0 blocks serves sequences without keys."""
    q = _arr(framework, (2, 1, 2, 8), 1)
    cache = _arr(framework, (0, 4, 1, 8), 2)
    table = _i32(framework, [[0], [0]])
    out, lse = anyattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=_i32(framework, [0, 0]),
                                               block_table=table, return_softmax_lse=True)
    assert (_np(out) == 0).all() and (_np(lse) == -np.inf).all()
    qv = _arr(framework, (3, 2, 8), 3)
    cu_q, cu_k = _i32(framework, [0, 2, 3]), _i32(framework, [0, 0, 0])
    out = anyattn.flash_attn_varlen_func(qv, cache, cache, cu_q, cu_k, 2, 0, block_table=table)
    assert (_np(out) == 0).all()


# ---- Merge ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_merge_no_tokens_and_no_columns(framework):
    a, la = _arr(framework, (0, 2, 8), 1), _arr(framework, (2, 0), 2)
    out, lse = anyattn.merge_attention_states(a, la, a, la)
    assert tuple(out.shape) == (0, 2, 8) and tuple(lse.shape) == (2, 0)
    a4, la4 = _arr(framework, (2, 0, 3, 8), 1), _arr(framework, (2, 3, 0), 2)
    anyattn.merge_attention_states_(a4, la4, a4, la4)
    empty = _arr(framework, (3, 1, 0), 3)
    lse_a = _arr(framework, (1, 3), 4)
    lse_b = _arr(framework, (1, 3), 5)
    out, lse = anyattn.merge_attention_states(empty, lse_a, empty, lse_b)
    np.testing.assert_allclose(_np(lse), np.logaddexp(_np(lse_a), _np(lse_b)), rtol=1e-6)


# ---- Autograd ---------------------------------------------------------------------------------------


def _grads(q, k, v, fn):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = fn(q, k, v)
    out.sum().backward()
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    "q_shape,k_shape,dv",
    [
        ((0, 3, 2, 8), (0, 4, 1, 8), 8),
        ((2, 0, 2, 8), (2, 4, 1, 8), 8),
        ((2, 3, 2, 8), (2, 0, 1, 8), 8),
        ((2, 3, 0, 8), (2, 4, 0, 8), 8),
        ((2, 3, 0, 8), (2, 4, 1, 8), 8),
        ((2, 3, 2, 8), (2, 4, 1, 8), 0),
        ((2, 3, 2, 0), (2, 4, 1, 0), 4),
    ],
)
def test_dense_backward(q_shape, k_shape, dv):
    q, k = _arr("torch", q_shape, 1), _arr("torch", k_shape, 2)
    v = _arr("torch", k_shape[:3] + (dv,), 3)
    _, dq, dk, dv_ = _grads(q, k, v, lambda a, b, c: anyattn.flash_attn_func(a, b, c, causal=True))
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    if q_shape[1] == 0 or q_shape[2] == 0 or dv == 0:  # nothing attended or nothing to pass back
        assert (dk == 0).all() and (dv_ == 0).all()
    if k_shape[1] == 0 or dv == 0:
        assert (dq == 0).all()
    if q_shape[3] == 0:  # every weight equal; the loss is the sum of out
        ref_v = v.clone().requires_grad_(True)
        want = _zero_score_ref_torch(ref_v, q_shape[1], q_shape[2])
        want.sum().backward()
        torch.testing.assert_close(dv_, ref_v.grad, rtol=1e-5, atol=1e-6)


def _zero_score_ref_torch(v, sq, hq):
    """Causal attention with all-zero scores in torch, for autograd."""
    b, sk, hk, _ = v.shape
    rows = []
    for i in range(sq):
        last = i + sk - sq
        rows.append(v[:, : last + 1].mean(dim=1).repeat_interleave(hq // hk, dim=1))
    return torch.stack(rows, dim=1)


def test_backward_with_sinks_and_no_batch():
    q, k = _arr("torch", (0, 3, 2, 8), 1), _arr("torch", (0, 4, 1, 8), 2)
    sinks = torch.zeros(2, requires_grad=True)
    q.requires_grad_(True)
    anyattn.flash_attn_func(q, k, k, sinks=sinks).sum().backward()
    assert (sinks.grad == 0).all()


@pytest.mark.parametrize(
    "cu_q,cu_k,d,dv",
    [
        ([0], [0], 8, 8),
        ([0, 0, 0], [0, 3, 5], 8, 8),
        ([0, 2, 3], [0, 0, 0], 8, 8),
        ([0, 2, 2, 4], [0, 3, 5, 5], 0, 4),
        ([0, 2, 2, 4], [0, 3, 5, 5], 8, 0),
    ],
)
def test_varlen_backward(cu_q, cu_k, d, dv):
    q, k = _arr("torch", (cu_q[-1], 2, d), 1), _arr("torch", (cu_k[-1], 1, d), 2)
    v = _arr("torch", (cu_k[-1], 1, dv), 3)
    tq, tk = _i32("torch", cu_q), _i32("torch", cu_k)
    mq, mk = int(max(np.diff(cu_q), default=0)), int(max(np.diff(cu_k), default=0))
    _, dq, dk, dv_ = _grads(q, k, v, lambda a, b, c: anyattn.flash_attn_varlen_func(
        a, b, c, tq, tk, mq, mk, causal=True))
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    if cu_q[-1] == 0 or dv == 0:
        assert (dk == 0).all() and (dv_ == 0).all()
    if cu_k[-1] == 0 or dv == 0:
        assert (dq == 0).all()
    if cu_q == [0, 2, 2, 4]:  # sequence 1 has keys but no queries
        assert (dk[3:5] == 0).all() and (dv_[3:5] == 0).all()


# ---- torch.compile fake kernels ---------------------------------------------------------------------


def test_fake_kernels_give_empty_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    with FakeTensorMode():
        q, k, v = torch.empty(2, 3, 0, 8), torch.empty(2, 4, 0, 8), torch.empty(2, 4, 0, 0)
        out, lse = torch.ops.anyattn.fwd(q, k, v, 0.0, 0.0, True, -1, -1, None, None)
        assert tuple(out.shape) == (2, 3, 0, 0) and tuple(lse.shape) == (2, 0, 3)
        grads = torch.ops.anyattn.bwd(out, q, k, v, out, lse, 0.0, 0.0, True, -1, -1, None, None,
                                      0.0, None)
        assert [tuple(g.shape) for g in grads] == [(2, 3, 0, 8), (2, 4, 0, 8), (2, 4, 0, 0), (0,)]
        qv, cu = torch.empty(0, 2, 0), torch.zeros(1, dtype=torch.int32)
        out, lse = torch.ops.anyattn.fwd_varlen(qv, qv, qv, cu, cu, None, 0, 0, 0.0, 0.0, False,
                                                -1, -1, None, None)
        assert tuple(out.shape) == (0, 2, 0) and tuple(lse.shape) == (2, 0)
        qc, cache = torch.empty(0, 1, 2, 8), torch.empty(0, 16, 1, 8)
        out, lse = torch.ops.anyattn.fwd_kvcache(qc, cache, cache, None, None, None, None, None,
                                                 -1, None, None, None, False, 0.0, 0.0, False, -1,
                                                 -1, None, None, 0)
        assert tuple(out.shape) == (0, 1, 2, 8) and tuple(lse.shape) == (0, 2, 1)


def test_opcheck_on_empty_and_head_dim_zero():
    for q_shape, k_shape, dv in [((2, 0, 2, 8), (2, 4, 1, 8), 8), ((2, 3, 2, 0), (2, 4, 1, 0), 4)]:
        q = _arr("torch", q_shape, 1).requires_grad_(True)
        k = _arr("torch", k_shape, 2).requires_grad_(True)
        v = _arr("torch", k_shape[:3] + (dv,), 3).requires_grad_(True)
        args = (q, k, v, 0.0, 0.0, True, -1, -1, None, None)
        torch.library.opcheck(torch.ops.anyattn.fwd.default, args)


def test_compiled_call_on_head_dim_zero():
    q, k = _arr("torch", (1, 3, 2, 0), 1), _arr("torch", (1, 4, 1, 0), 2)
    v = _arr("torch", (1, 4, 1, 4), 3)
    fn = torch.compile(lambda a, b, c: anyattn.flash_attn_func(a, b, c, causal=True),
                       backend="eager", fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), anyattn.flash_attn_func(q, k, v, causal=True))
