"""FlashAttention 3 and 4 call styles (anyattn.fa3_interface, anyattn.fa4_interface).

Each function is called as FA3/FA4 call sites call it (hopper/test_flash_attn.py, sglang's FA3
backend, FA4's README and tests) and checked against anyattn's flash-attn 2.x functions (bitwise,
where the same kernel runs) or against a float64 masked reference by flash-attn's 2x rule, whose
mask is built from the documented FA3/FA4 semantics (window, chunk, seqused, paging).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import fa3_interface as fa3  # noqa: E402
from anyattn import fa4_interface as fa4  # noqa: E402
from reference import check_2x, lse_eps, out_eps  # noqa: E402
from torch_reference import f64, randn  # noqa: E402

DTYPES = ["float32", "bfloat16", "float16"]


# ---- Oracles --------------------------------------------------------------------------------


def fa_mask(sq, sk, causal=False, window=(-1, -1), chunk=0):
    """(Sq, Sk) bool, FA's bottom-right aligned visibility: window (-1 = unbounded), causal
    (right = 0), and attention_chunk (same chunk as the diagonal key i + Sk - Sq)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    d = i + sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= d - left
    if right >= 0:
        ok &= j <= d + right
    if chunk:
        lo = d - torch.remainder(d, chunk)
        ok &= (j >= lo) & (j < lo + chunk)
    return ok


def masked_ref(q, k, v, mask, *, scale=None, softcap=0.0, sinks=None, dtype=None):
    """Attention of q (B,Sq,Hq,D) on k/v (B,Sk,Hk,D[v]) under mask (Sq,Sk) or (B,Sq,Sk).

    Returns (out (B,Sq,Hq,Dv), lse (B,Hq,Sq)): float64 when ``dtype`` is None, else the naive
    same-dtype computation of the 2x rule (each matmul in float32 rounded to dtype, scale and
    softcap rounded, softmax in float32, probabilities rounded). Differentiable in float64.
    """
    work = torch.float64 if dtype is None else torch.float32

    def rnd(x):
        return x if dtype is None else x.to(dtype).to(torch.float32)

    q, k, v = (x.to(work) for x in (q, k, v))
    b, sq, hq, d = q.shape
    group = hq // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scale = d ** -0.5 if scale is None else scale
    s = rnd(torch.einsum("bqhd,bkhd->bhqk", q, k))
    s = rnd(s * scale)
    if softcap:
        s = rnd(softcap * torch.tanh(s / softcap))
    mask = mask.reshape(-1, 1, sq, k.shape[1])
    s = s.masked_fill(~mask, -math.inf)
    if sinks is not None:
        col = sinks.to(work).reshape(1, hq, 1, 1).expand(b, hq, sq, 1)
        s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    live = torch.isfinite(lse)[..., None]
    p = torch.where(live, torch.exp(s - torch.where(live, lse[..., None], 0.0)), 0.0)
    p = rnd(p[..., :k.shape[1]])
    out = rnd(torch.einsum("bhqk,bkhd->bqhd", p, v))
    return out, lse


def assert_2x(name, out, lse, q, k, v, mask, dtype, **kw):
    """out (and lse unless None) against masked_ref by flash-attn's 2x rule."""
    ref_o, ref_l = masked_ref(q, k, v, mask, **kw)
    nv_o, nv_l = masked_ref(q, k, v, mask, dtype=getattr(torch, dtype), **kw)
    check_2x(f"{name} out", f64(out), f64(ref_o), f64(nv_o), out_eps(dtype, f64(ref_o)))
    if lse is not None:
        check_2x(f"{name} lse", f64(lse), f64(ref_l), f64(nv_l), lse_eps(f64(ref_l)))


def cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


# ---- FA3: flash_attn_func -------------------------------------------------------------------


FA3_DENSE = [
    # (Sq, Sk, Hq, Hk, causal, window_size, softcap, sinks)
    (7, 11, 4, 4, False, (-1, -1), 0.0, None),
    (7, 11, 4, 2, True, (-1, -1), 0.0, "sinks"),
    (9, 5, 4, 1, True, (2, -1), 0.0, None),
    (8, 8, 4, 2, False, (3, 1), 1.5, "learnable_sink"),
    (6, 10, 2, 2, False, (None, 2), 0.0, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,sk,hq,hk,causal,window,softcap,sink_name", FA3_DENSE)
def test_fa3_func_is_fa2_func(dtype, sq, sk, hq, hk, causal, window, softcap, sink_name):
    q, k, v = (randn(s, dtype, i) for i, s in enumerate([(2, sq, hq, 16), (2, sk, hk, 16),
                                                         (2, sk, hk, 16)]))
    sinks = randn((hq,), "float32", 9) if sink_name else None
    extra = {sink_name: sinks} if sink_name else {}
    out = fa3.flash_attn_func(q, k, v, causal=causal, qv=None, q_descale=None, k_descale=None,
                              v_descale=None, window_size=window, attention_chunk=0,
                              softcap=softcap, pack_gqa=None, num_splits=1, **extra)
    out2, lse2 = fa3.flash_attn_func(q, k, v, None, causal, window_size=window, softcap=softcap,
                                     return_attn_probs=True, **extra)
    w = tuple(-1 if x is None else x for x in window)
    ref = anyattn.flash_attn_func(q, k, v, causal=causal, window_size=w, softcap=softcap,
                                  return_attn_probs=True, sinks=sinks)
    assert isinstance(out, torch.Tensor) and out.shape == (2, sq, hq, 16)
    assert torch.equal(out, ref[0]) and torch.equal(out2, ref[0]) and torch.equal(lse2, ref[1])
    assert lse2.shape == (2, hq, sq) and lse2.dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
@pytest.mark.parametrize("sq,sk,causal,window", [(9, 14, True, (-1, -1)), (14, 9, True, (-1, -1)),
                                                 (10, 10, False, (-1, -1)),
                                                 (8, 13, False, (2, 1))])
def test_fa3_attention_chunk_matches_masked_reference(dtype, chunk, sq, sk, causal, window):
    hq, hk, d = 4, 2, 16
    q, k, v = randn((2, sq, hq, d), dtype, 1), randn((2, sk, hk, d), dtype, 2), randn(
        (2, sk, hk, d), dtype, 3)
    sinks = randn((hq,), "float32", 4) if chunk == 3 else None
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                   attention_chunk=chunk, return_attn_probs=True, sinks=sinks)
    assert out.shape == (2, sq, hq, d) and lse.shape == (2, hq, sq)
    mask = fa_mask(sq, sk, causal, window, chunk)
    assert_2x(f"chunk{chunk}", out, lse, q, k, v, mask, dtype, sinks=sinks)


def test_fa3_attention_chunk_larger_than_keys_is_plain_attention():
    q, k, v = randn((1, 6, 2, 8), "float32", 1), randn((1, 9, 2, 8), "float32", 2), randn(
        (1, 9, 2, 8), "float32", 3)
    got = fa3.flash_attn_func(q, k, v, causal=True, attention_chunk=64)
    assert torch.allclose(got, anyattn.flash_attn_func(q, k, v, causal=True), atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fa3_func_backward_is_fa2_backward(dtype):
    q, k, v = randn((2, 9, 4, 16), dtype, 1), randn((2, 12, 2, 16), dtype, 2), randn(
        (2, 12, 2, 16), dtype, 3)
    sinks = randn((4,), "float32", 4)
    dout = randn((2, 9, 4, 16), dtype, 5)

    def grads(fn, **kw):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        out = fn(*leaves[:3], causal=True, window_size=(4, -1), softcap=2.0, sinks=leaves[3],
                 **kw)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out, leaves, dout)

    got = grads(fa3.flash_attn_func)
    ref = grads(anyattn.flash_attn_func)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)


def test_fa3_attention_chunk_backward_matches_float64_autograd():
    sq, sk, chunk = 10, 13, 4
    q, k, v = randn((2, sq, 4, 16), "float32", 1), randn((2, sk, 2, 16), "float32", 2), randn(
        (2, sk, 2, 16), "float32", 3)
    sinks = randn((4,), "float32", 4)
    dout = randn((2, sq, 4, 16), "float32", 5)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out = fa3.flash_attn_func(*leaves[:3], causal=True, attention_chunk=chunk, sinks=leaves[3])
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v, sinks)]
    ref_out, _ = masked_ref(*ref_leaves[:3], fa_mask(sq, sk, True, chunk=chunk),
                            sinks=ref_leaves[3])
    ref = torch.autograd.grad(ref_out, ref_leaves, dout.double())
    for name, g, r in zip("q k v sinks".split(), got, ref):
        scale = float(r.abs().max())
        assert float((g.double() - r).abs().max()) <= 1e-5 * max(scale, 1.0), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_fa3_qkvpacked_func(dtype):
    qkv = randn((2, 7, 3, 4, 16), dtype, 1)
    out, lse = fa3.flash_attn_qkvpacked_func(qkv, None, True, window_size=(3, 0),
                                             return_attn_probs=True)
    ref = anyattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True,
                                  window_size=(3, 0), return_attn_probs=True)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    # GQA layout: (B, S, Hq + 2 Hk, D) with num_heads_q.
    packed = randn((2, 7, 8, 16), dtype, 2).requires_grad_()
    out = fa3.flash_attn_qkvpacked_func(packed, causal=True, num_heads_q=4)
    q, k, v = packed.detach().split([4, 2, 2], dim=2)
    assert torch.equal(out, anyattn.flash_attn_func(q, k, v, causal=True))
    out.sum().backward()
    assert packed.grad is not None and packed.grad.shape == packed.shape
    with pytest.raises(ValueError, match="num_heads_q"):
        fa3.flash_attn_qkvpacked_func(packed.detach())


# ---- FA3: flash_attn_varlen_func --------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2))])
def test_fa3_varlen_is_fa2_varlen(dtype, causal, window):
    lq, lk = [3, 6, 1], [5, 6, 9]
    q, k, v = randn((10, 4, 16), dtype, 1), randn((20, 2, 16), dtype, 2), randn(
        (20, 2, 16), dtype, 3)
    used_k = torch.tensor([4, 6, 2], dtype=torch.int32)
    out = fa3.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 6, 9, seqused_k=used_k,
                                     causal=causal, window_size=window, softcap=0.0,
                                     num_splits=1, pack_gqa=None)
    # sglang calls FA3's varlen with return_softmax_lse (sgl-kernel's name).
    out2, lse2 = fa3.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 6, 9, seqused_k=used_k,
                                            softmax_scale=0.25 if causal else None,
                                            causal=causal, window_size=window,
                                            return_softmax_lse=True)
    ref = anyattn.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 6, 9, causal=causal,
                                         window_size=window, return_attn_probs=True,
                                         seqused_k=used_k)
    ref2 = anyattn.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 6, 9, causal=causal,
                                          window_size=window, return_attn_probs=True,
                                          seqused_k=used_k,
                                          softmax_scale=0.25 if causal else None)
    assert torch.equal(out, ref[0]) and torch.equal(out2, ref2[0]) and torch.equal(lse2, ref2[1])
    assert out.shape == (10, 4, 16) and lse2.shape == (4, 10)


def _per_sequence_check(name, out, lse, q, k, v, q_rows, q_used, k_rows, dtype, causal=False,
                        window=(-1, -1), chunk=0, sinks=None):
    """Sequence b: rows q_rows[b] (first q_used[b] computed) against keys k_rows[b]; packed out
    (total, H, Dv), lse (H, total). Unused rows must be 0 / -inf."""
    for rows, used, keys in zip(q_rows, q_used, k_rows):
        live = rows[:used]
        if len(live):
            mask = fa_mask(len(live), len(keys), causal, window, chunk)
            assert_2x(name, out[live][None], lse[:, live][None], q[live][None], k[keys][None],
                      v[keys][None], mask, dtype, sinks=sinks)
        dead = rows[used:]
        assert torch.all(out[dead] == 0) and torch.all(lse[:, dead] == -math.inf)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("chunk", [0, 3])
def test_fa3_varlen_seqused_q_and_k(dtype, sinks, chunk):
    lq, lk = [4, 7, 3], [6, 9, 5]
    used_q, used_k = [2, 7, 0], [6, 4, 5]
    q, k, v = randn((14, 4, 16), dtype, 1), randn((20, 2, 16), dtype, 2), randn(
        (20, 2, 16), dtype, 3)
    s = randn((4,), "float32", 4) if sinks else None
    out, lse = fa3.flash_attn_varlen_func(
        q, k, v, cu(lq), cu(lk), max(lq), max(lk), seqused_q=torch.tensor(used_q).int(),
        seqused_k=torch.tensor(used_k).int(), causal=True, attention_chunk=chunk,
        return_attn_probs=True, sinks=s)
    cq, ck = cu(lq).tolist(), cu(lk).tolist()
    q_rows = [torch.arange(cq[b], cq[b + 1]) for b in range(3)]
    k_rows = [torch.arange(ck[b], ck[b] + used_k[b]) for b in range(3)]
    _per_sequence_check("seqused", out, lse, q, k, v, q_rows, used_q, k_rows, dtype,
                        causal=True, chunk=chunk, sinks=s)


def test_fa3_varlen_batched_layout_without_cu_seqlens():
    q, k, v = randn((2, 6, 4, 16), "bfloat16", 1), randn((2, 8, 2, 16), "bfloat16", 2), randn(
        (2, 8, 2, 16), "bfloat16", 3)
    used_q, used_k = torch.tensor([6, 3]).int(), torch.tensor([5, 8]).int()
    out, lse = fa3.flash_attn_varlen_func(q, k, v, None, None, 6, 8, seqused_q=used_q,
                                          seqused_k=used_k, causal=True, return_attn_probs=True)
    assert out.shape == (2, 6, 4, 16) and lse.shape == (2, 4, 6)
    for b in range(2):
        nq, nk = int(used_q[b]), int(used_k[b])
        ref = anyattn.flash_attn_func(q[b:b + 1, :nq], k[b:b + 1, :nk], v[b:b + 1, :nk],
                                      causal=True, return_attn_probs=True)
        assert torch.allclose(out[b:b + 1, :nq].float(), ref[0].float(), atol=1e-2)
        assert torch.allclose(lse[b:b + 1, :, :nq], ref[1], atol=1e-4)
        assert torch.all(out[b, nq:] == 0) and torch.all(lse[b, :, nq:] == -math.inf)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fa3_varlen_backward_is_fa2_backward(dtype):
    lq, lk = [3, 5], [4, 7]
    q, k, v = randn((8, 4, 16), dtype, 1), randn((11, 2, 16), dtype, 2), randn(
        (11, 2, 16), dtype, 3)
    dout = randn((8, 4, 16), dtype, 4)

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves, cu(lq), cu(lk), 5, 7, causal=True)
        return torch.autograd.grad(out, leaves, dout)

    for g, r in zip(grads(fa3.flash_attn_varlen_func), grads(anyattn.flash_attn_varlen_func)):
        assert torch.equal(g, r)


def test_fa3_varlen_seqused_q_backward_matches_float64_autograd():
    lq, lk, used_q = [4, 6], [5, 7], [3, 6]
    q, k, v = randn((10, 2, 8), "float32", 1), randn((12, 2, 8), "float32", 2), randn(
        (12, 2, 8), "float32", 3)
    dout = randn((10, 2, 8), "float32", 4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fa3.flash_attn_varlen_func(*leaves, cu(lq), cu(lk), 6, 7,
                                     seqused_q=torch.tensor(used_q).int(), causal=True)
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    pieces = []
    cq, ck = cu(lq).tolist(), cu(lk).tolist()
    for b in range(2):
        rows = slice(cq[b], cq[b] + used_q[b])
        keys = slice(ck[b], ck[b + 1])
        o, _ = masked_ref(ref_leaves[0][rows][None], ref_leaves[1][keys][None],
                          ref_leaves[2][keys][None], fa_mask(used_q[b], lk[b], True))
        pieces.append((rows, o[0]))
    loss = sum((o * dout.double()[rows]).sum() for rows, o in pieces)
    ref = torch.autograd.grad(loss, ref_leaves)
    for name, g, r in zip("qkv", got, ref):
        assert float((g.double() - r).abs().max()) <= 1e-5 * max(float(r.abs().max()), 1), name
    assert torch.all(got[0][3:4] == 0)  # the unused row of sequence 0 gets no gradient


# ---- FA3: flash_attn_with_kvcache -------------------------------------------------------------


def _rotary(positions, rotary_dim, dtype="float32"):
    t = torch.arange(positions, dtype=torch.float64)[:, None] * 10000.0 ** (
        -2.0 * torch.arange(rotary_dim // 2, dtype=torch.float64) / rotary_dim)
    return torch.cos(t).to(getattr(torch, dtype)), torch.sin(t).to(getattr(torch, dtype))


def _paged(cache, page, seed):
    """(paged cache (blocks + 2, page, H, D), page_table (B, cap // page)) holding ``cache``."""
    b, cap = cache.shape[:2]
    per = cap // page
    perm = torch.randperm(b * per + 2, generator=torch.Generator().manual_seed(seed))[:b * per]
    table = perm.reshape(b, per).to(torch.int32)
    paged = torch.zeros((b * per + 2, page) + tuple(cache.shape[2:]), dtype=cache.dtype)
    for bi in range(b):
        for p in range(per):
            paged[table[bi, p]] = cache[bi, p * page:(p + 1) * page]
    return paged, table


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_fa3_kvcache_is_fa2_kvcache(dtype, paged, rotary):
    b, sq, hq, hk, d, cap = 2, 2, 4, 2, 16, 24
    q = randn((b, sq, hq, d), dtype, 1)
    k_new, v_new = randn((b, sq, hk, d), dtype, 2), randn((b, sq, hk, d), dtype, 3)
    k_cache, v_cache = randn((b, cap, hk, d), dtype, 4), randn((b, cap, hk, d), dtype, 5)
    seqlens = torch.tensor([5, 17], dtype=torch.int32)
    leftpad = torch.tensor([0, 3], dtype=torch.int32)
    table = None
    if paged:
        k_cache, table = _paged(k_cache, 4, 6)
        v_cache, _ = _paged(v_cache, 4, 6)
        leftpad = None
    kw = {}
    if rotary:
        cos, sin = _rotary(cap, 8)
        kw = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False)
    sinks = randn((hq,), "float32", 7)
    caches = (k_cache.clone(), v_cache.clone())
    meta = fa3.get_scheduler_metadata(b, sq, cap, hq, hk, d, seqlens, qkv_dtype=q.dtype,
                                      page_size=4 if paged else None, causal=True)
    out, lse, *rest = fa3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, None, cache_seqlens=seqlens, cache_leftpad=leftpad,
        page_table=table, causal=True, window_size=(-1, -1), scheduler_metadata=meta,
        num_splits=0, return_softmax_lse=True, sinks=sinks, **kw)
    ref_out, ref_lse = anyattn.flash_attn_with_kvcache(
        q, caches[0], caches[1], k_new, v_new, cache_seqlens=seqlens, cache_leftpad=leftpad,
        block_table=table, causal=True, return_softmax_lse=True, sinks=sinks, **kw)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert torch.equal(k_cache, caches[0]) and torch.equal(v_cache, caches[1])
    assert len(rest) == 2 and all(r.numel() == 0 for r in rest)
    plain = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=19,
                                        page_table=table, causal=True)
    assert isinstance(plain, torch.Tensor) and plain.shape == (b, sq, hq, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [0, 4])
def test_fa3_kvcache_packed_queries_sglang_style(dtype, chunk):
    """sglang's FA3 backend: packed q, a token-level page table, k/v already in the cache and
    cu_seqlens_k_new passed although no new keys are given."""
    hq, hk, d = 4, 2, 16
    lens_q, lens_k = [1, 5, 3], [9, 12, 3]
    slots = 40
    key_cache, value_cache = randn((slots, 1, hk, d), dtype, 1), randn((slots, 1, hk, d), dtype,
                                                                         2)
    perm = torch.randperm(slots, generator=torch.Generator().manual_seed(3))
    page_table = torch.stack([perm[i * 12:(i + 1) * 12] for i in range(3)]).to(torch.int32)
    q = randn((sum(lens_q), hq, d), dtype, 4)
    cache_seqlens = torch.tensor(lens_k, dtype=torch.int32)
    o, softmax_lse, *rest = fa3.flash_attn_with_kvcache(
        q=q, k_cache=key_cache, v_cache=value_cache, page_table=page_table,
        cache_seqlens=cache_seqlens, cu_seqlens_q=cu(lens_q), cu_seqlens_k_new=cu(lens_k),
        max_seqlen_q=max(lens_q), softmax_scale=d ** -0.5, causal=True, window_size=(-1, -1),
        softcap=0.0, k_descale=None, v_descale=None, return_softmax_lse=True, num_splits=0,
        attention_chunk=chunk)
    assert o.shape == (9, hq, d) and softmax_lse.shape == (hq, 9) and len(rest) == 2
    cq = cu(lens_q).tolist()
    for b in range(3):
        keys = page_table[b, :lens_k[b]].long()
        rows = slice(cq[b], cq[b + 1])
        mask = fa_mask(lens_q[b], lens_k[b], True, chunk=chunk)
        assert_2x("sglang", o[rows][None], softmax_lse[:, rows][None], q[rows][None],
                  key_cache[keys, 0][None], value_cache[keys, 0][None], mask, dtype)
    if chunk == 0:
        ref = anyattn.flash_attn_varlen_func(q, key_cache, value_cache, cu(lens_q), None, 5, 12,
                                             causal=True, block_table=page_table,
                                             seqused_k=cache_seqlens, return_attn_probs=True)
        assert torch.equal(o, ref[0]) and torch.equal(softmax_lse, ref[1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fa3_kvcache_packed_new_keys_with_rotary_and_chunk(dtype):
    """FA3's test style: packed q and packed new keys (cu_seqlens_k_new), rotary, chunked
    attention. The appended cache rows must equal anyattn's own append, the output the masked
    reference on the rotated inputs."""
    b, hq, hk, d, cap, chunk = 2, 4, 2, 16, 20, 4
    new = [3, 2]
    stored = torch.tensor([6, 11], dtype=torch.int32)
    q = randn((sum(new), hq, d), dtype, 1)
    k_new, v_new = randn((sum(new), hk, d), dtype, 2), randn((sum(new), hk, d), dtype, 3)
    k_cache, v_cache = randn((b, cap, hk, d), dtype, 4), randn((b, cap, hk, d), dtype, 5)
    cos, sin = _rotary(cap, 8)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=stored,
        cu_seqlens_q=cu(new), cu_seqlens_k_new=cu(new), max_seqlen_q=3, causal=True,
        attention_chunk=chunk, rotary_interleaved=True, return_softmax_lse=True)
    cq = cu(new).tolist()
    for bi in range(b):  # anyattn's own append of the same tokens, one sequence at a time
        rows = slice(cq[bi], cq[bi + 1])
        anyattn.flash_attn_with_kvcache(q[None, rows], k_ref[bi:bi + 1], v_ref[bi:bi + 1],
                                        k_new[None, rows], v_new[None, rows],
                                        rotary_cos=cos, rotary_sin=sin,
                                        cache_seqlens=int(stored[bi]), causal=True)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    for bi in range(b):
        rows = slice(cq[bi], cq[bi + 1])
        n_keys = int(stored[bi]) + new[bi]
        pos = torch.arange(int(stored[bi]), n_keys)
        qr = _rotate64(q[rows].double(), cos[pos].double(), sin[pos].double())
        mask = fa_mask(new[bi], n_keys, True, chunk=chunk)
        ref_o, ref_l = masked_ref(qr[None], k_cache[bi:bi + 1, :n_keys],
                                  v_cache[bi:bi + 1, :n_keys], mask)
        tol = 1e-5 if dtype == "float32" else 3e-2
        assert float((out[rows].double() - ref_o[0]).abs().max()) < tol
        assert float((lse[:, rows].double() - ref_l[0]).abs().max()) < tol


def _rotate64(x, cos, sin):
    """x (S, H, D) rotated GPT-J style (interleaved pairs) by cos/sin (S, rotary_dim / 2)."""
    x = x.clone()
    rd = cos.shape[1] * 2
    a, b = x[..., 0:rd:2].clone(), x[..., 1:rd:2].clone()
    c, s = cos[:, None, :], sin[:, None, :]
    x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    return x


def test_fa3_kvcache_batched_decode_with_chunk_and_leftpad():
    """llama4-style chunked attention in a decode step: chunks start at cache_leftpad."""
    b, hq, hk, d, cap, chunk = 3, 4, 1, 16, 30, 8
    q = randn((b, 1, hq, d), "float32", 1)
    k_cache, v_cache = randn((b, cap, hk, d), "float32", 2), randn((b, cap, hk, d), "float32", 3)
    seqlens = torch.tensor([8, 9, 27], dtype=torch.int32)
    leftpad = torch.tensor([0, 2, 5], dtype=torch.int32)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                      cache_leftpad=leftpad, causal=True, attention_chunk=chunk)
    for bi in range(b):
        keys = slice(int(leftpad[bi]), int(seqlens[bi]))
        n = int(seqlens[bi]) - int(leftpad[bi])
        mask = fa_mask(1, n, True, chunk=chunk)
        assert_2x("decode", out[bi:bi + 1], None, q[bi:bi + 1], k_cache[bi:bi + 1, keys],
                  v_cache[bi:bi + 1, keys], mask, "float32")


def test_fa3_kvcache_errors_name_the_argument():
    q = randn((2, 1, 2, 8), "float32", 1)
    k_cache, v_cache = randn((2, 6, 2, 8), "float32", 2), randn((2, 6, 2, 8), "float32", 3)
    k_new = randn((2, 2, 2, 8), "float32", 4)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new, cache_seqlens=5,
                                    attention_chunk=2)
    with pytest.raises(ValueError, match="cache_leftpad"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2, attention_chunk=2,
                                    cache_leftpad=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary_cos"):
        cos, sin = _rotary(3, 4)
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos,
                                    rotary_sin=sin, cache_seqlens=2, attention_chunk=2)
    with pytest.raises(ValueError, match="attention_chunk"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2, attention_chunk=-1)
    with pytest.raises(TypeError, match="k: dtype"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new.double(), k_new.double(),
                                    cache_seqlens=2, attention_chunk=2)
    with pytest.raises(ValueError, match="k_cache: 1 cache batches for 2 sequences"):
        fa3.flash_attn_with_kvcache(q, k_cache[:1], v_cache[:1], cache_seqlens=2,
                                    attention_chunk=2)
    with pytest.raises(ValueError, match="cache_batch_idx: repeats"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new, cache_seqlens=2,
                                    cache_batch_idx=torch.tensor([1, 1]).int(), attention_chunk=2)
    with pytest.raises(ValueError, match="page_table: sequence 0 writes position 2 to block 9"):
        fa3.flash_attn_with_kvcache(q, k_cache.reshape(6, 2, 2, 8), v_cache.reshape(6, 2, 2, 8),
                                    k_new, k_new, cache_seqlens=2, attention_chunk=2,
                                    page_table=torch.tensor([[0, 9, 2], [3, 4, 5]]).int())


def test_fa3_kvcache_has_no_backward():
    q = randn((1, 1, 2, 8), "float32", 1).requires_grad_()
    k_cache, v_cache = randn((1, 6, 2, 8), "float32", 2), randn((1, 6, 2, 8), "float32", 3)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4,
                                      cu_seqlens_q=None, attention_chunk=2)
    with pytest.raises(NotImplementedError, match="no backward"):
        out.sum().backward()


# ---- FA3: flash_attn_combine --------------------------------------------------------------------


def _combine_ref(out_partial, lse_partial):
    lse = torch.logsumexp(lse_partial.double(), dim=0)
    scale = torch.exp(lse_partial.double() - lse)
    scale = torch.where(torch.isfinite(scale), scale, torch.zeros_like(scale))
    return (scale.unsqueeze(-1) * out_partial.double()).sum(0), lse


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
def test_fa3_combine_matches_logsumexp_reference(out_dtype):
    splits, b, s, h, d = 3, 2, 5, 4, 16
    out_partial = randn((splits, b, h, s, d), "float32", 1).transpose(2, 3)
    lse_partial = randn((splits, b, h, s), "float32", 2).transpose(-1, -2)
    lse_partial[1:, :1] = -math.inf
    lse_partial[:, 1, 0] = -math.inf  # every split empty: out 0, lse -inf
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    ref_o, ref_l = _combine_ref(out_partial, lse_partial)
    assert out.shape == (b, s, h, d) and lse.shape == (b, s, h)
    assert out.dtype == (torch.float32 if out_dtype is None else out_dtype)
    tol = 1e-5 if out_dtype is None else 1e-2
    assert float((out.double() - ref_o).abs().max()) < tol
    assert torch.allclose(lse.double(), ref_l, atol=1e-5)
    assert torch.all(out[1, 0] == 0) and torch.all(lse[1, 0] == -math.inf)
    buf = torch.empty((b, s, h, d))
    got, _ = fa3.flash_attn_combine(out_partial, lse_partial, out=buf)
    assert got is buf and torch.allclose(buf.double(), ref_o, atol=1e-5)
    with pytest.raises(ValueError, match="lse_partial"):
        fa3.flash_attn_combine(out_partial, lse_partial[:, :, :2])


# ---- FA3: bad input ---------------------------------------------------------------------------


FA3_CALLS = {
    "flash_attn_func": lambda **kw: fa3.flash_attn_func(
        randn((1, 3, 2, 8), "float32", 1), randn((1, 4, 2, 8), "float32", 2),
        randn((1, 4, 2, 8), "float32", 3), **kw),
    "flash_attn_varlen_func": lambda **kw: fa3.flash_attn_varlen_func(
        randn((3, 2, 8), "float32", 1), randn((4, 2, 8), "float32", 2),
        randn((4, 2, 8), "float32", 3), cu([3]), cu([4]), 3, 4, **kw),
    "flash_attn_with_kvcache": lambda **kw: fa3.flash_attn_with_kvcache(
        randn((1, 1, 2, 8), "float32", 1), randn((1, 4, 2, 8), "float32", 2),
        randn((1, 4, 2, 8), "float32", 3), cache_seqlens=3, **kw),
}


# The descales read float8 inputs and 8-bit caches (test_fa3_fp8.py, test_kvcache_8bit.py); qv
# is supported everywhere (test_fa3_qv.py).


@pytest.mark.parametrize("name", ["k_descale", "v_descale"])
def test_fa3_kvcache_descale_of_a_float_cache_is_rejected(name):
    call = FA3_CALLS["flash_attn_with_kvcache"]
    with pytest.raises(ValueError, match=rf"^{name}: given for a float32 KV cache; scales read "
                                         "8-bit caches only"):
        call(**{name: torch.ones(1, 2)})


def test_fa3_bad_input_names_the_argument():
    call = FA3_CALLS["flash_attn_varlen_func"]
    with pytest.raises(ValueError, match="seqused_q: sequence 0 uses 5 queries; supported: 0 .. 3"):
        call(seqused_q=torch.tensor([5]).int())
    with pytest.raises(ValueError, match="seqused_q: expected shape"):
        call(seqused_q=torch.tensor([1, 2]).int())
    with pytest.raises(ValueError, match="window_size"):
        FA3_CALLS["flash_attn_func"](window_size=(-3, 0))
    with pytest.raises(ValueError, match="attention_chunk"):
        FA3_CALLS["flash_attn_func"](attention_chunk=-2)
    with pytest.raises(TypeError, match="attention_chunk"):
        FA3_CALLS["flash_attn_func"](attention_chunk=2.5)
    with pytest.raises(ValueError, match="sinks, learnable_sink"):
        FA3_CALLS["flash_attn_func"](sinks=torch.zeros(2), learnable_sink=torch.zeros(2))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fa3.flash_attn_varlen_func(randn((3, 2, 8), "float32", 1), randn((4, 2, 8), "float32", 2),
                                   randn((4, 2, 8), "float32", 3), torch.tensor([0, 5]).int(),
                                   cu([4]), 3, 4, seqused_q=torch.tensor([1]).int())


def test_fa3_public_names():
    assert set(fa3.__all__) == {"flash_attn_func", "flash_attn_varlen_func",
                                "flash_attn_qkvpacked_func", "flash_attn_with_kvcache",
                                "flash_attn_combine", "get_scheduler_metadata"}
    meta = fa3.get_scheduler_metadata(2, 1, 16, 4, 2, 64, torch.tensor([3, 4]).int())
    assert isinstance(meta, torch.Tensor) and meta.numel() == 0


# ---- FA4: flash_attn_func -----------------------------------------------------------------------


FA4_WINDOWS = [
    # (causal, FA4 window_size, the flash-attn 2.x window it means)
    (False, (None, None), (-1, -1)),
    (True, (None, None), (-1, 0)),
    (False, (None, 0), (-1, 0)),
    (False, (3, None), (3, -1)),
    (True, (4, None), (4, 0)),
    (False, (2, 1), (2, 1)),
    (False, (-1, -1), (-1, -1)),  # FA2's convention: the pair sums below 0, so no window
    (False, (-1, 0), (-1, -1)),   # FA4 drops any int pair summing below 0
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window,fa2_window", FA4_WINDOWS)
def test_fa4_func_is_fa2_func(dtype, causal, window, fa2_window):
    q, k, v = randn((2, 6, 4, 16), dtype, 1), randn((2, 9, 2, 16), dtype, 2), randn(
        (2, 9, 2, 16), dtype, 3)
    sink = randn((4,), "bfloat16", 4)
    out, lse = fa4.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                   learnable_sink=sink, softcap=0.0, pack_gqa=True)
    assert lse is None
    out2, lse2 = fa4.flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal,
                                     window_size=window, learnable_sink=sink, return_lse=True)
    ref = anyattn.flash_attn_func(q, k, v, causal=causal, window_size=fa2_window, sinks=sink,
                                  return_attn_probs=True)
    ref2 = anyattn.flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal,
                                   window_size=fa2_window, sinks=sink, return_attn_probs=True)
    assert torch.equal(out, ref[0]) and torch.equal(out2, ref2[0]) and torch.equal(lse2, ref2[1])
    assert lse2.shape == (2, 4, 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fa4_func_matches_masked_reference_with_sink_and_softcap(dtype):
    q, k, v = randn((2, 7, 4, 16), dtype, 1), randn((2, 10, 1, 16), dtype, 2), randn(
        (2, 10, 1, 16), dtype, 3)
    sink = randn((4,), "bfloat16", 4)
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, window_size=(5, None),
                                   learnable_sink=sink, softcap=3.0, return_lse=True)
    assert_2x("fa4", out, lse, q, k, v, fa_mask(7, 10, True, (5, -1)), dtype, softcap=3.0,
              sinks=sink)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fa4_backward_is_fa2_backward_and_returns_lse_for_grad(dtype):
    q, k, v = randn((2, 6, 4, 16), dtype, 1), randn((2, 8, 2, 16), dtype, 2), randn(
        (2, 8, 2, 16), dtype, 3)
    sink = randn((4,), "bfloat16", 4)
    dout = randn((2, 6, 4, 16), dtype, 5)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
    out, lse = fa4.flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3])
    assert lse is not None and lse.shape == (2, 4, 6)  # FA4 returns the LSE when grad is needed
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
    ref = anyattn.flash_attn_func(*ref_leaves[:3], causal=True, sinks=ref_leaves[3])
    for g, r in zip(got, torch.autograd.grad(ref, ref_leaves, dout)):
        assert torch.equal(g, r)
    assert got[3].dtype == torch.bfloat16


# ---- FA4: flash_attn_varlen_func ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [(None, None), (2, None), (None, 1)])
def test_fa4_varlen_readme_call_is_fa2_varlen(dtype, window):
    lens = [3, 7, 4]
    q, k, v = randn((14, 4, 16), dtype, 1), randn((14, 4, 16), dtype, 2), randn((14, 4, 16),
                                                                              dtype, 3)
    out, lse = fa4.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu(lens), cu_seqlens_k=cu(lens),
                                          max_seqlen_q=7, max_seqlen_k=7, causal=True,
                                          window_size=window)
    assert lse is None and out.shape == (14, 4, 16)
    w = tuple(-1 if x is None else x for x in window)
    ref = anyattn.flash_attn_varlen_func(q, k, v, cu(lens), cu(lens), 7, 7, causal=True,
                                         window_size=w)
    assert torch.equal(out, ref)
    out2, lse2 = fa4.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu(lens),
                                            cu_seqlens_k=cu(lens), causal=True,
                                            window_size=window, return_lse=True)
    assert torch.equal(out2, ref) and lse2.shape == (4, 14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sink", [False, True])
def test_fa4_varlen_seqused(dtype, sink):
    lq, lk = [5, 2, 6], [7, 3, 8]
    used_q, used_k = [3, 2, 0], [7, 1, 5]
    q, k, v = randn((13, 4, 16), dtype, 1), randn((18, 2, 16), dtype, 2), randn(
        (18, 2, 16), dtype, 3)
    s = randn((4,), "bfloat16", 4) if sink else None
    out, lse = fa4.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=6, max_seqlen_k=8,
        seqused_q=torch.tensor(used_q).int(), seqused_k=torch.tensor(used_k).int(),
        causal=True, learnable_sink=s, return_lse=True)
    cq, ck = cu(lq).tolist(), cu(lk).tolist()
    q_rows = [torch.arange(cq[b], cq[b + 1]) for b in range(3)]
    k_rows = [torch.arange(ck[b], ck[b] + used_k[b]) for b in range(3)]
    _per_sequence_check("fa4 seqused", out, lse, q, k, v, q_rows, used_q, k_rows, dtype,
                        causal=True, sinks=s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [(None, None), (3, None)])
def test_fa4_varlen_paged(dtype, window):
    hq, hk, d, page = 4, 2, 16, 3
    lq, used_k = [1, 4, 2], [7, 9, 2]
    k_log, v_log = randn((3, 9, hk, d), dtype, 1), randn((3, 9, hk, d), dtype, 2)
    k_cache, table = _paged(k_log, page, 3)
    v_cache, _ = _paged(v_log, page, 3)
    q = randn((sum(lq), hq, d), dtype, 4)
    out, lse = fa4.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu(lq),
                                          seqused_k=torch.tensor(used_k).int(), page_table=table,
                                          causal=True, window_size=window, return_lse=True)
    cq = cu(lq).tolist()
    w = tuple(-1 if x is None else x for x in window)
    for b in range(3):
        rows = slice(cq[b], cq[b + 1])
        mask = fa_mask(lq[b], used_k[b], True, w)
        assert_2x("paged", out[rows][None], lse[:, rows][None], q[rows][None],
                  k_log[b:b + 1, :used_k[b]], v_log[b:b + 1, :used_k[b]], mask, dtype)
    # Without seqused_k every sequence has the table's full capacity (9 keys).
    full, _ = fa4.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu(lq),
                                         page_table=table, causal=True)
    for b in range(3):
        rows = slice(cq[b], cq[b + 1])
        assert_2x("paged full", full[rows][None], None, q[rows][None], k_log[b:b + 1],
                  v_log[b:b + 1], fa_mask(lq[b], 9, True), dtype)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        fa4.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu(lq),
                                   cu_seqlens_k=cu(used_k), page_table=table)


def test_fa4_varlen_batched_layout_and_backward():
    q, k, v = randn((2, 5, 2, 8), "float32", 1), randn((2, 7, 2, 8), "float32", 2), randn(
        (2, 7, 2, 8), "float32", 3)
    dout = randn((2, 5, 2, 8), "float32", 4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = fa4.flash_attn_varlen_func(*leaves, causal=True,
                                          seqused_k=torch.tensor([7, 4]).int())
    assert out.shape == (2, 5, 2, 8) and lse.shape == (2, 2, 5)
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out = torch.cat([
        masked_ref(ref_leaves[0][b:b + 1], ref_leaves[1][b:b + 1, :n], ref_leaves[2][b:b + 1, :n],
                   fa_mask(5, n, True))[0] for b, n in enumerate([7, 4])])
    ref = torch.autograd.grad(ref_out, ref_leaves, dout.double())
    for name, g, r in zip("qkv", got, ref):
        assert float((g.double() - r).abs().max()) <= 1e-5 * max(float(r.abs().max()), 1), name


# ---- FA4: unsupported parameters, combine, names ----------------------------------------------


# qv and gather_kv_indices are supported (test_fa3_qv.py, test_fa4_gather.py).
FA4_SHARED = ["score_mod", "score_mod_bwd", "mask_mod", "aux_tensors",
              "aux_scalars", "block_sparse_tensors"]
FA4_UNSUPPORTED = (
    [(False, name) for name in FA4_SHARED + ["block_sparse_tensors_bwd", "full_block_cnt",
                                             "full_block_idx", "mask_block_cnt",
                                             "mask_block_idx", "block_size"]]
    + [(True, name) for name in FA4_SHARED + ["cu_total_m_blocks", "cu_total_n_blocks"]])


def _unsupported_value(name, like):
    if name in ("score_mod", "score_mod_bwd", "mask_mod"):
        return lambda *args: args[0]
    if name in ("aux_tensors", "aux_scalars", "block_sparse_tensors", "block_sparse_tensors_bwd"):
        return [like]
    if name == "block_size":
        return (128, 128)
    return torch.zeros_like(like)


@pytest.mark.parametrize("varlen,name", FA4_UNSUPPORTED)
def test_fa4_unsupported_parameters_raise_naming_them(varlen, name):
    q, k, v = randn((1, 3, 2, 8), "float32", 1), randn((1, 4, 2, 8), "float32", 2), randn(
        (1, 4, 2, 8), "float32", 3)
    fn = fa4.flash_attn_varlen_func if varlen else fa4.flash_attn_func
    fn(q, k, v, **{name: None})  # the default is accepted
    with pytest.raises(NotImplementedError, match=rf"^{name}: not supported by anyattn"):
        fn(q, k, v, **{name: _unsupported_value(name, q)})
    fn(q, k, v, aux_tensors=[])  # an empty capture list is no capture


def test_fa4_positional_call_of_an_older_release_is_explained():
    q, k, v = randn((1, 3, 2, 8), "float32", 1), randn((1, 4, 2, 8), "float32", 2), randn(
        (1, 4, 2, 8), "float32", 3)
    with pytest.raises(TypeError, match="softmax_scale by keyword"):
        fa4.flash_attn_func(q, k, v, 0.125, True)


@pytest.mark.parametrize("packed", [False, True])
def test_fa4_combine(packed):
    splits, b, s, h, d = 4, 2, 5, 3, 8
    if packed:
        out_partial = randn((splits, b * s, h, d), "float32", 1)
        lse_partial = randn((splits, b * s, h), "float32", 2)
    else:
        out_partial = randn((splits, b, s, h, d), "float32", 1)
        lse_partial = randn((splits, b, s, h), "float32", 2)
    lse_partial[2:] = -math.inf
    out, lse = fa4.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16)
    ref_o, ref_l = _combine_ref(out_partial, lse_partial)
    assert out.dtype == torch.bfloat16 and out.shape == out_partial.shape[1:]
    assert float((out.double() - ref_o).abs().max()) < 2e-2
    assert torch.allclose(lse.double(), ref_l, atol=1e-5) and lse.shape == lse_partial.shape[1:]
    out, lse = fa4.flash_attn_combine(out_partial, lse_partial, return_lse=False)
    assert lse is None and torch.allclose(out.double(), ref_o, atol=1e-5)
    if packed:
        out, lse = fa4.flash_attn_combine(out_partial, lse_partial,
                                          cu_seqlens=torch.tensor([0, 4, 7]).int())
        assert torch.all(out[7:] == 0) and torch.all(lse[7:] == -math.inf)
        assert torch.allclose(out[:7].double(), ref_o[:7], atol=1e-5)
    else:
        out, lse = fa4.flash_attn_combine(out_partial, lse_partial,
                                          seqused=torch.tensor([5, 2]).int())
        assert torch.all(out[1, 2:] == 0) and torch.all(lse[1, 2:] == -math.inf)
        assert torch.allclose(out[1, :2].double(), ref_o[1, :2], atol=1e-5)
    with pytest.raises(NotImplementedError, match="varlen_batch_idx"):
        fa4.flash_attn_combine(out_partial, lse_partial, varlen_batch_idx=torch.zeros(2).int())


def test_fa4_public_names():
    assert fa4.__all__ == ["flash_attn_func", "flash_attn_varlen_func"]
    assert isinstance(fa4.__version__, str) and callable(fa4.flash_attn_combine)
