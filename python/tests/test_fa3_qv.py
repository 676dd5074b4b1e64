"""FlashAttention 3's and 4's ``qv`` (absorbed MLA's value-side query) in anyattn.fa3_interface
and anyattn.fa4_interface.

FA3 and FA4 define the scores as softmax_scale * (q . k + qv . v), default scale (headdim +
headdim_v) ** -0.5 (hopper/flash_attn_interface.py, flash_attn/cute/interface.py); FA4 also
takes q = None (scores qv . v) and returns the LSE heads-last when qv is given. The oracle is
that definition in float64 (attention over [q | qv] and [k | v]); the naive side of
flash-attn's 2x rule is the same computation in the input dtype. The KV-cache cases use
DeepSeek's latent layout (one row [v | k]: v_cache = cache[..., :DV], k_cache =
cache[..., DV:]), read in place, and separate caches, gathered into a copy.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import fa3_interface as fa3  # noqa: E402
from anyattn import fa4_interface as fa4  # noqa: E402
from anyattn import kv_quant  # noqa: E402
from anyattn._fa_qv import row_query, shared_row  # noqa: E402
from anyattn.rotary import apply_rotary_emb  # noqa: E402
from reference import attention_ref, check_2x, lse_eps, out_eps  # noqa: E402
from torch_reference import attention_torch, f64, grads_2x, naive_gradients, randn  # noqa: E402

D, DV = 16, 48  # the rotary and latent widths of the tests (DeepSeek: 64 and 512)


def reference(q, k, v, qv, *, causal, dtype):
    """(out, lse) in float64 and (out, lse) of the naive same-dtype computation, (B,S,H,*)."""
    qw, kw = np.concatenate([f64(q), f64(qv)], -1), np.concatenate([f64(k), f64(v)], -1)
    return (attention_ref(qw, kw, f64(v), causal=causal),
            attention_ref(qw, kw, f64(v), causal=causal, dtype=dtype))


def assert_2x(name, out, lse, ref, naive, dtype):
    check_2x(f"{name} out", f64(out), ref[0], naive[0], out_eps(dtype, ref[0]))
    check_2x(f"{name} lse", f64(lse), ref[1], naive[1], lse_eps(ref[1]))


# ---- flash_attn_func and flash_attn_varlen_func ---------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_func_with_qv_adds_the_value_scores(dtype, causal):
    q, k = randn((2, 5, 4, D), dtype, 1), randn((2, 9, 2, D), dtype, 2)
    v, qv = randn((2, 9, 2, DV), dtype, 3), randn((2, 5, 4, DV), dtype, 4)
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, qv=qv, return_attn_probs=True)
    assert out.shape == (2, 5, 4, DV) and out.dtype == q.dtype
    ref, naive = reference(q, k, v, qv, causal=causal, dtype=dtype)
    assert_2x("func", out, lse, ref, naive, dtype)
    # The default scale is FA3's (D + DV) ** -0.5: the same call with it given is bitwise equal.
    again = fa3.flash_attn_func(q, k, v, (D + DV) ** -0.5, causal, qv)
    assert torch.equal(out, again)


def qv_inputs(dtype, seed):
    """q, k, v, qv, dout of a causal GQA problem, values representable in dtype (float64)."""
    shapes = [(1, 6, 4, D), (1, 8, 2, D), (1, 8, 2, DV), (1, 6, 4, DV), (1, 6, 4, DV)]
    return [randn(s, dtype, seed + i).double() for i, s in enumerate(shapes)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_func_with_qv_gradients_are_those_of_the_widened_call(dtype):
    """Bitwise: dq/dqv are the widened query's gradient split, dk the widened key's head, and dv
    the values' gradient plus the widened key's tail."""
    tdt = getattr(torch, dtype)
    q, k, v, qv, dout = (x.to(tdt) for x in qv_inputs(dtype, 10))
    ins = [x.clone().requires_grad_(True) for x in (q, k, v, qv)]
    out = fa3.flash_attn_func(ins[0], ins[1], ins[2], causal=True, qv=ins[3])
    dq, dk, dv, dqv = torch.autograd.grad(out, ins, dout)
    wide = [torch.cat([q, qv], -1), torch.cat([k, v], -1), v]
    wide = [x.clone().requires_grad_(True) for x in wide]
    out_w = anyattn.flash_attn_func(*wide, causal=True)
    dqw, dkw, dvw = torch.autograd.grad(out_w, wide, dout)
    assert torch.equal(out, out_w)
    assert torch.equal(dq, dqw[..., :D]) and torch.equal(dqv, dqw[..., D:])
    assert torch.equal(dk, dkw[..., :D]) and torch.equal(dv, dvw + dkw[..., D:])


# float32 is left out here: on problems this small its backward sits at the rule's bound (the
# known limitation recorded in test_backward.py, _F32_OVER); the bitwise test above covers it.
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_func_with_qv_gradients_meet_the_2x_rule(dtype):
    tdt = getattr(torch, dtype)
    q, k, v, qv, dout = qv_inputs(dtype, 20)
    got_in = [x.to(tdt).requires_grad_(True) for x in (q, k, v, qv)]
    out = fa3.flash_attn_func(got_in[0], got_in[1], got_in[2], causal=True, qv=got_in[3])
    got = dict(zip(["dq", "dk", "dv", "dqv"], torch.autograd.grad(out, got_in, dout.to(tdt))))
    ref_in = [x.clone().requires_grad_(True) for x in (q, k, v, qv)]
    ref_out = attention_torch(torch.cat([ref_in[0], ref_in[3]], -1),
                              torch.cat([ref_in[1], ref_in[2]], -1), ref_in[2], causal=True)
    ref = dict(zip(["dq", "dk", "dv", "dqv"], torch.autograd.grad(ref_out, ref_in, dout)))
    dqw, dkw, dvw, _ = naive_gradients(torch.cat([q, qv], -1).to(tdt),
                                       torch.cat([k, v], -1).to(tdt), v.to(tdt), dout.to(tdt),
                                       dtype=tdt, causal=True)
    naive = {"dq": dqw[..., :D], "dqv": dqw[..., D:], "dk": dkw[..., :D],
             "dv": (dvw + dkw[..., D:]).to(tdt).float()}
    grads_2x(got, ref, naive, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_varlen_with_qv_attends_each_sequence(dtype):
    lengths_q, lengths_k = [3, 1, 5], [4, 6, 5]
    cu_q = torch.tensor(np.cumsum([0] + lengths_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lengths_k), dtype=torch.int32)
    q, k = randn((9, 4, D), dtype, 30), randn((15, 1, D), dtype, 31)
    v, qv = randn((15, 1, DV), dtype, 32), randn((9, 4, DV), dtype, 33)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, causal=True, qv=qv,
                                          return_attn_probs=True)
    for b in range(3):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        ref, naive = reference(q[None, rq], k[None, rk], v[None, rk], qv[None, rq], causal=True,
                               dtype=dtype)
        assert_2x(f"sequence {b}", out[None, rq], lse[None, :, rq], ref, naive, dtype)


def test_qv_of_a_wrong_shape_dtype_or_width_is_rejected_naming_it():
    q, k, v = randn((1, 2, 2, D), "float32", 1), randn((1, 3, 2, D), "float32", 2), \
        randn((1, 3, 2, DV), "float32", 3)
    with pytest.raises(ValueError, match=r"qv: expected shape \(1, 2, 2, 48\)"):
        fa3.flash_attn_func(q, k, v, qv=randn((1, 2, 2, DV + 1), "float32", 4))
    with pytest.raises(TypeError, match="qv: dtype torch.bfloat16"):
        fa3.flash_attn_func(q, k, v, qv=randn((1, 2, 2, DV), "bfloat16", 4))
    wide_v = randn((1, 3, 2, 570), "float32", 5)
    with pytest.raises(ValueError, match="qv: headdim \\+ headdim_v = 16 \\+ 570 = 586"):
        fa3.flash_attn_func(q, k, wide_v, qv=randn((1, 2, 2, 570), "float32", 6))


# ---- flash_attn_with_kvcache ------------------------------------------------------------------


def latent_cache(dtype, blocks, page, seed):
    """A paged latent cache (blocks, page, 1, DV + D) and its v/k views, DeepSeek's layout."""
    cache = randn((blocks, page, 1, DV + D), dtype, seed)
    return cache, cache[..., DV:], cache[..., :DV]


def gathered(cache, table, b, n, page):
    """The first n rows of sequence b of a paged cache, (n, 1, width)."""
    return torch.cat([cache[int(table[b, p // page]), p % page][None] for p in range(n)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("append", [False, True])
def test_kvcache_with_qv_reads_the_latent_row_in_place(dtype, append):
    b, sq, hq, page, blocks = 2, 1 + append, 8, 4, 7
    cache, k_cache, v_cache = latent_cache(dtype, blocks, page, 40)
    assert shared_row(k_cache, v_cache).data_ptr() == cache.data_ptr()
    table = torch.tensor([[3, 0, 5], [6, 1, 2]], dtype=torch.int32)
    seqlens = torch.tensor([5, 9], dtype=torch.int32)
    q, qv = randn((b, sq, hq, D), dtype, 41), randn((b, sq, hq, DV), dtype, 42)
    kw = {}
    if append:
        kw = {"k": randn((b, sq, 1, D), dtype, 43), "v": randn((b, sq, 1, DV), dtype, 44)}
    before = cache.clone()
    out, lse, *_ = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv, cache_seqlens=seqlens,
                                               page_table=table, causal=True,
                                               return_softmax_lse=True, **kw)
    expected = before.clone()
    for bi in range(b):
        for t in range(sq if append else 0):
            p = int(seqlens[bi]) + t
            row = expected[int(table[bi, p // page]), p % page]
            row[..., :DV], row[..., DV:] = kw["v"][bi, t], kw["k"][bi, t]
    assert torch.equal(cache, expected)
    for bi in range(b):
        rows = gathered(cache, table, bi, int(seqlens[bi]) + (sq if append else 0), page)[None]
        ref, naive = reference(q[bi:bi + 1], rows[..., DV:], rows[..., :DV], qv[bi:bi + 1],
                               causal=True, dtype=dtype)
        assert_2x(f"sequence {bi}", out[bi:bi + 1], lse[bi:bi + 1], ref, naive, dtype)


def test_the_row_query_reads_qv_and_q_in_place_where_they_are_one_tensor():
    """sglang slices qv and q from one query [qv | q]: the row's query is that tensor itself."""
    q_all = randn((3, 8, DV + D), "bfloat16", 7)
    joined = row_query(q_all[..., DV:], q_all[..., :DV])
    assert joined.data_ptr() == q_all.data_ptr() and torch.equal(joined, q_all)
    apart = row_query(q_all[..., DV:].clone(), q_all[..., :DV].clone())
    assert apart.data_ptr() != q_all.data_ptr() and torch.equal(apart, q_all)
    # q's columns before qv's are not [qv | q]: copied in that order.
    swapped = row_query(q_all[..., :D], q_all[..., D:])
    assert torch.equal(swapped, torch.cat([q_all[..., D:], q_all[..., :D]], -1))


@pytest.mark.parametrize("cache_dtype", [None, torch.int8])
def test_kvcache_with_qv_packed_queries_append_into_the_latent_row(cache_dtype):
    """sglang's FA3 call shape: packed q and qv (cu_seqlens_q), one new row per sequence."""
    page, blocks, hq = 4, 7, 8
    full, _, _ = latent_cache("bfloat16", blocks, page, 100)
    tokens = None
    cache = full
    if cache_dtype is not None:
        cache, _, tokens = kv_quant.quantize_kv_cache(full, cache_dtype, "token")
    twin = cache.clone()
    twin_tokens = None if tokens is None else tokens.clone()
    table = torch.tensor([[3, 0, 5], [6, 1, 2]], dtype=torch.int32)
    seqlens = torch.tensor([5, 8], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32)
    q, qv = randn((3, hq, D), "bfloat16", 101), randn((3, hq, DV), "bfloat16", 102)
    k_new, v_new = randn((2, 1, 1, D), "bfloat16", 103), randn((2, 1, 1, DV), "bfloat16", 104)
    out = fa3.flash_attn_with_kvcache(
        q, cache[..., DV:], cache[..., :DV], k=k_new, v=v_new, qv=qv, cache_seqlens=seqlens,
        page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=2, causal=True,
        k_token_scale=tokens, v_token_scale=tokens)
    new_rows = torch.cat([v_new, k_new], -1)
    want = fa3.flash_attn_with_kvcache(
        torch.cat([qv, q], -1), twin, twin[..., :DV], k=new_rows, v=new_rows[..., :DV],
        cache_seqlens=seqlens, page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=2,
        causal=True, k_token_scale=twin_tokens, softmax_scale=(D + DV) ** -0.5)
    assert torch.equal(out, want)
    assert torch.equal(cache.view(torch.uint8), twin.view(torch.uint8))
    if tokens is not None:
        assert torch.equal(tokens, twin_tokens)
    else:
        for b in range(2):
            p = int(seqlens[b])
            row = cache[int(table[b, p // page]), p % page]
            assert torch.equal(row, new_rows[b, 0])


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.int8])
def test_kvcache_with_qv_on_an_8bit_latent_row_is_the_shared_latent_call(cache_dtype):
    b, hq, page, blocks = 2, 8, 4, 6
    full, _, _ = latent_cache("bfloat16", blocks, page, 50)
    if cache_dtype == torch.int8:  # per-token scales
        cache, descale, tokens = kv_quant.quantize_kv_cache(full, cache_dtype, "token")
    else:
        cache, descale, tokens = kv_quant.quantize_kv_cache(full, cache_dtype, "tensor")
    twin = cache.clone()
    twin_tokens = None if tokens is None else tokens.clone()
    table = torch.tensor([[2, 4], [5, 0]], dtype=torch.int32)
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    q, qv = randn((b, 1, hq, D), "bfloat16", 51), randn((b, 1, hq, DV), "bfloat16", 52)
    k_new, v_new = randn((b, 1, 1, D), "bfloat16", 53), randn((b, 1, 1, DV), "bfloat16", 54)
    out = fa3.flash_attn_with_kvcache(
        q, cache[..., DV:], cache[..., :DV], k=k_new, v=v_new, qv=qv, cache_seqlens=seqlens,
        page_table=table, k_descale=descale, v_descale=None if descale is None else
        descale.clone(), k_token_scale=tokens, v_token_scale=tokens)
    # The same call written as anyattn's shared latent cache, on a twin of the cache.
    new_rows = torch.cat([v_new, k_new], -1)
    want = anyattn.flash_attn_with_kvcache(
        torch.cat([qv, q], -1), twin, twin[..., :DV], k=new_rows, v=new_rows[..., :DV],
        cache_seqlens=seqlens, block_table=table, k_descale=descale, k_token_scale=twin_tokens,
        softmax_scale=(D + DV) ** -0.5)
    assert torch.equal(out, want)
    assert torch.equal(cache.view(torch.uint8), twin.view(torch.uint8))
    if tokens is not None:
        assert torch.equal(tokens, twin_tokens)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kvcache_with_qv_on_separate_caches_with_rotary_appends_into_both(dtype):
    b, sq, hq, cap, rot = 2, 2, 4, 12, 8
    k_cache, v_cache = randn((b, cap, 1, D), dtype, 60), randn((b, cap, 1, DV), dtype, 61)
    assert shared_row(k_cache, v_cache) is None
    q, qv = randn((b, sq, hq, D), dtype, 62), randn((b, sq, hq, DV), dtype, 63)
    k_new, v_new = randn((b, sq, 1, D), dtype, 64), randn((b, sq, 1, DV), dtype, 65)
    angles = torch.arange(cap + sq, dtype=torch.float64)[:, None] * \
        torch.linspace(0.1, 1.0, rot // 2, dtype=torch.float64)[None]
    cos, sin = angles.cos().float(), angles.sin().float()
    seqlens = torch.tensor([4, 7], dtype=torch.int32)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, qv=qv, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=seqlens, causal=True, rotary_interleaved=False, return_softmax_lse=True)
    # The same append and rotation without qv, on copies: anyattn's FA2 call.
    k_twin, v_twin = k_before.clone(), v_before.clone()
    anyattn.flash_attn_with_kvcache(q, k_twin, v_twin, k=k_new, v=v_new, rotary_cos=cos,
                                    rotary_sin=sin, cache_seqlens=seqlens, causal=True,
                                    rotary_interleaved=False)
    assert torch.equal(k_cache, k_twin) and torch.equal(v_cache, v_twin)
    rotated_q = apply_rotary_emb(q, cos, sin, interleaved=False,
                                 seqlen_offsets=seqlens)
    for bi in range(b):
        n = int(seqlens[bi]) + sq
        ref, naive = reference(rotated_q[bi:bi + 1], k_cache[bi:bi + 1, :n],
                               v_cache[bi:bi + 1, :n], qv[bi:bi + 1], causal=True, dtype=dtype)
        assert_2x(f"sequence {bi}", out[bi:bi + 1], lse[bi:bi + 1], ref, naive, dtype)


def test_kvcache_with_qv_rejects_what_one_row_cannot_hold():
    blocks, page = 4, 4
    full = randn((blocks, page, 1, DV + D), "bfloat16", 70)
    cache, descale, _ = kv_quant.quantize_kv_cache(full, torch.float8_e4m3fn, "tensor")
    q, qv = randn((1, 1, 4, D), "bfloat16", 71), randn((1, 1, 4, DV), "bfloat16", 72)
    kw = {"cache_seqlens": torch.tensor([3], dtype=torch.int32),
          "page_table": torch.tensor([[1, 2]], dtype=torch.int32)}
    before = cache.clone()
    with pytest.raises(ValueError, match="k_descale, v_descale: with qv on one row"):
        fa3.flash_attn_with_kvcache(q, cache[..., DV:], cache[..., :DV], qv=qv,
                                    k_descale=descale, v_descale=2 * descale, **kw)
    separate_k = cache[..., DV:].clone()
    with pytest.raises(NotImplementedError, match="qv: with an 8-bit cache"):
        fa3.flash_attn_with_kvcache(q, separate_k, cache[..., :DV], qv=qv, k_descale=descale,
                                    v_descale=descale, **kw)
    assert torch.equal(cache.view(torch.uint8), before.view(torch.uint8))
    k_cache, v_cache = randn((1, 8, 1, D), "float32", 73), randn((1, 8, 1, DV), "float32", 74)
    wide = torch.ones((12, D // 2 + 1), dtype=torch.float32)
    with pytest.raises(ValueError, match="rotary_cos: rotary_dim 18 exceeds q's head dim 16"):
        fa3.flash_attn_with_kvcache(q.float(), k_cache, v_cache, k=k_cache[:, :1],
                                    v=v_cache[:, :1], qv=qv.float(), rotary_cos=wide,
                                    rotary_sin=wide, cache_seqlens=2)


def test_kvcache_with_qv_on_one_query_rejects_scales_one_row_cannot_take():
    """q and qv sliced from one query take the one-call path, which declines a row whose V
    scales are not K's: the call raises as it does for separate q and qv."""
    kw = {"cache_seqlens": torch.tensor([3], dtype=torch.int32),
          "page_table": torch.tensor([[1, 2]], dtype=torch.int32)}
    q_all = randn((1, 1, 4, DV + D), "bfloat16", 76)
    q, qv = q_all[..., DV:], q_all[..., :DV]
    full = randn((4, 4, 1, DV + D), "bfloat16", 75)
    cache, descale, _ = kv_quant.quantize_kv_cache(full, torch.float8_e4m3fn, "tensor")
    with pytest.raises(ValueError, match="k_descale, v_descale: with qv on one row"):
        fa3.flash_attn_with_kvcache(q, cache[..., DV:], cache[..., :DV], qv=qv,
                                    k_descale=descale, v_descale=2 * descale, **kw)
    cache, _, tokens = kv_quant.quantize_kv_cache(full, torch.int8, "token")
    with pytest.raises(ValueError, match="k_token_scale, v_token_scale: with qv on one row"):
        fa3.flash_attn_with_kvcache(q, cache[..., DV:], cache[..., :DV], qv=qv,
                                    k_token_scale=tokens, v_token_scale=tokens.clone(), **kw)
    out = fa3.flash_attn_with_kvcache(q, cache[..., DV:], cache[..., :DV], qv=qv,
                                      k_token_scale=tokens, v_token_scale=tokens, **kw)
    want = anyattn.flash_attn_with_kvcache(q_all, cache, cache[..., :DV], k_token_scale=tokens,
                                           block_table=kw["page_table"],
                                           cache_seqlens=kw["cache_seqlens"],
                                           softmax_scale=(D + DV) ** -0.5)
    assert torch.equal(out, want)


# ---- FlashAttention 4 ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fa4_func_with_qv_is_fa3s_with_the_lse_heads_last(dtype):
    q, k = randn((2, 5, 4, D), dtype, 80), randn((2, 9, 2, D), dtype, 81)
    v, qv = randn((2, 9, 2, DV), dtype, 82), randn((2, 5, 4, DV), dtype, 83)
    out, lse = fa4.flash_attn_func(q, k, v, qv, causal=True, return_lse=True)
    want, want_lse = fa3.flash_attn_func(q, k, v, causal=True, qv=qv, return_attn_probs=True)
    assert torch.equal(out, want)
    assert lse.shape == (2, 5, 4) and lse.is_contiguous()
    assert torch.equal(lse, want_lse.transpose(1, 2))
    assert fa4.flash_attn_func(q, k, v, qv, causal=True)[1] is None


def test_fa4_func_with_qv_alone_scores_qv_against_v():
    qv, v = randn((1, 4, 4, DV), "float32", 84), randn((1, 7, 1, DV), "float32", 85)
    ins = [x.clone().requires_grad_(True) for x in (qv, v)]
    out, lse = fa4.flash_attn_func(None, None, ins[1], ins[0], causal=True)
    assert lse.shape == (1, 4, 4)
    dout = randn(out.shape, "float32", 86)
    dqv, dv = torch.autograd.grad(out, ins, dout)
    plain = [qv.clone().requires_grad_(True), v.clone().requires_grad_(True)]
    want = anyattn.flash_attn_func(plain[0], plain[1], plain[1], causal=True)
    want_dqv, want_dv = torch.autograd.grad(want, plain, dout)
    assert torch.equal(out, want) and torch.equal(dqv, want_dqv) and torch.equal(dv, want_dv)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fa4_paged_varlen_with_qv_reads_the_latent_row_in_place(dtype):
    page, blocks = 4, 7
    cache, k_cache, v_cache = latent_cache(dtype, blocks, page, 90)
    table = torch.tensor([[3, 0, 5], [6, 1, 2]], dtype=torch.int32)
    seqused = torch.tensor([6, 11], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32)
    q, qv = randn((3, 8, D), dtype, 91), randn((3, 8, DV), dtype, 92)
    out, lse = fa4.flash_attn_varlen_func(q, k_cache, v_cache, qv, cu_seqlens_q=cu_q,
                                          seqused_k=seqused, page_table=table, causal=True,
                                          return_lse=True)
    assert lse.shape == (3, 8)
    for b in range(2):
        rq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rows = gathered(cache, table, b, int(seqused[b]), page)[None]
        ref, naive = reference(q[None, rq], rows[..., DV:], rows[..., :DV], qv[None, rq],
                               causal=True, dtype=dtype)
        assert_2x(f"sequence {b}", out[None, rq], lse[rq].T[None], ref, naive, dtype)
