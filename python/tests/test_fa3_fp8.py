"""FlashAttention 3's FP8 call style (anyattn._fa3_fp8): float8 q, k and v with q_descale,
k_descale and v_descale in flash_attn_func, flash_attn_varlen_func and flash_attn_qkvpacked_func,
and float8 q against an 8-bit KV cache in flash_attn_with_kvcache (sglang's FA3 backend casts q
to the cache's dtype); and FA4's functions with float8 inputs (unit descales). Each result is
checked against attention over the dequantized values in float64, by flash-attn's rule against a
naive bfloat16 run of the same dequantized problem: FA3 and FA4 return bfloat16 for float8
inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anyattn
from anyattn import fa3_interface as fa3
from reference import attention_ref, check_2x, lse_eps, out_eps

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _descale(kind, batch, hk, seed):
    """A descale of a granularity: None (1), per tensor (1,), per kv head (Hk,) or per
    (sequence, kv head) (B, Hk)."""
    g = torch.Generator().manual_seed(seed)
    shape = {"none": None, "tensor": (1,), "head": (hk,), "sequence": (batch, hk)}[kind]
    return None if shape is None else torch.rand(shape, generator=g) * 1.5 + 0.25


def _rows(descale, batch, hk):
    """A descale as float64 (B, Hk) rows (None: 1)."""
    if descale is None:
        return torch.ones(batch, hk, dtype=torch.float64)
    rows = descale.double()
    return torch.broadcast_to(rows if rows.dim() == 2 else rows.reshape(1, -1), (batch, hk))


def _dequantized(x8, descale, batch, heads_k):
    """float64 (B, S, H, D) values of a batched float8 tensor: x * descale of its (sequence, kv
    head), H a multiple of heads_k."""
    rows = _rows(descale, batch, heads_k).repeat_interleave(x8.shape[2] // heads_k, dim=1)
    return x8.double() * rows[:, None, :, None]


def _check(out, lse, q, k, v, **ref_kw):
    """out (bfloat16) and lse against the float64 reference of float64 q, k, v (B, S, H, D), by
    the 2x rule against a naive bfloat16 run."""
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    ref_out, ref_lse = attention_ref(qn, kn, vn, **ref_kw)
    naive_out, naive_lse = attention_ref(qn, kn, vn, dtype="bfloat16", **ref_kw)
    assert out.dtype == torch.bfloat16
    check_2x("out", out.double().numpy(), ref_out, naive_out, out_eps("bfloat16", ref_out))
    if lse is not None:
        check_2x("lse", lse.double().numpy(), ref_lse, naive_lse, lse_eps(ref_lse))


def _inputs(dtype, b, sq, sk, hq, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn((b, sq, hq, d), generator=g) * 2).to(dtype)
    k = (torch.randn((b, sk, hk, d), generator=g) * 2).to(dtype)
    v = torch.randn((b, sk, hk, d), generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", FLOAT8, ids=_name)
@pytest.mark.parametrize("granularity", ["none", "tensor", "head", "sequence"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_fp8_matches_the_dequantized_attention(dtype, granularity, causal):
    b, sq, sk, hq, hk, d = 2, 37, 70, 6, 2, 64
    q8, k8, v8 = _inputs(dtype, b, sq, sk, hq, hk, d)
    qd, kd, vd = (_descale(granularity, b, hk, s) for s in (1, 2, 3))
    out, lse = fa3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                   v_descale=vd, return_attn_probs=True)
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    _check(out, lse, _dequantized(q8, qd, b, hk), _dequantized(k8, kd, b, hk),
           _dequantized(v8, vd, b, hk), causal=causal)


def test_dense_fp8_with_window_softcap_sinks_and_chunks():
    b, sq, sk, hq, hk, d = 2, 50, 50, 4, 4, 32
    q8, k8, v8 = _inputs(torch.float8_e4m3fn, b, sq, sk, hq, hk, d, seed=5)
    qd, kd, vd = (_descale("sequence", b, hk, s) for s in (4, 5, 6))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    q, k, v = (_dequantized(x, s, b, hk) for x, s in ((q8, qd), (k8, kd), (v8, vd)))
    out, lse = fa3.flash_attn_func(q8, k8, v8, causal=True, window_size=(9, 0), softcap=4.0,
                                   q_descale=qd, k_descale=kd, v_descale=vd, sinks=sinks,
                                   return_attn_probs=True)
    _check(out, lse, q, k, v, causal=True, window=(9, 0), softcap=4.0, sinks=sinks.numpy())
    # attention_chunk 16: each query sees the keys of its diagonal's chunk only, as 16-key
    # sequences of their own (bottom-right aligned; sq == sk here).
    out = fa3.flash_attn_func(q8, k8, v8, causal=True, attention_chunk=16, q_descale=qd,
                              k_descale=kd, v_descale=vd)
    for c0 in range(0, sq, 16):
        c1 = min(c0 + 16, sq)
        _check(out[:, c0:c1], None, q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], causal=True)


def test_qkvpacked_fp8():
    b, s, h, d = 2, 33, 3, 64
    g = torch.Generator().manual_seed(9)
    qkv8 = torch.randn((b, s, 3, h, d), generator=g).to(torch.float8_e4m3fn)
    descales = [_descale("sequence", b, h, seed) for seed in (7, 8, 9)]
    out = fa3.flash_attn_qkvpacked_func(qkv8, causal=True, q_descale=descales[0],
                                        k_descale=descales[1], v_descale=descales[2])
    q, k, v = (_dequantized(qkv8[:, :, i], descales[i], b, h) for i in range(3))
    _check(out, None, q, k, v, causal=True)


@pytest.mark.parametrize("dtype", FLOAT8, ids=_name)
@pytest.mark.parametrize("batched_keys", [False, True], ids=["packed_keys", "batched_keys"])
def test_varlen_fp8_matches_each_sequence(dtype, batched_keys):
    lens_q, lens_k, hq, hk, d = [5, 1, 30], [40, 17, 30], 4, 2, 64
    b = len(lens_q)
    g = torch.Generator().manual_seed(13)
    q8 = torch.randn((sum(lens_q), hq, d), generator=g).to(dtype)
    cap = max(lens_k)
    k_full = torch.randn((b, cap, hk, d), generator=g).to(dtype)
    v_full = torch.randn((b, cap, hk, d), generator=g).to(dtype)
    qd, kd, vd = (_descale("sequence", b, hk, s) for s in (10, 11, 12))
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    if batched_keys:
        k8, v8, cu_k = k_full, v_full, None
        seqused_k = torch.tensor(lens_k, dtype=torch.int32)
    else:
        k8 = torch.cat([k_full[i, :n] for i, n in enumerate(lens_k)])
        v8 = torch.cat([v_full[i, :n] for i, n in enumerate(lens_k)])
        cu_k, seqused_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32), None
    out, lse = fa3.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(lens_q), cap,
                                          seqused_k=seqused_k, causal=True, q_descale=qd,
                                          k_descale=kd, v_descale=vd, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(lens_q), hq, d)
    for i, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        one = slice(i, i + 1)
        q = _dequantized(q8[rows][None], qd[one], 1, hk)
        k = _dequantized(k_full[one, :nk], kd[one], 1, hk)
        v = _dequantized(v_full[one, :nk], vd[one], 1, hk)
        _check(out[rows][None], lse[:, rows][None], q, k, v, causal=True)


@pytest.mark.parametrize("cache_dtype", FLOAT8, ids=_name)
@pytest.mark.parametrize("with_q_descale", [False, True], ids=["no_q_descale", "q_descale"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_with_fp8_queries_as_sglang_passes_them(cache_dtype, with_q_descale, paged):
    """q cast to the cache's float8 dtype, k_descale/v_descale (batch, nheads_k) of the cache,
    new keys appended in bfloat16 and quantized by the call."""
    b, sq, hq, hk, d, cap, s_new = 2, 3, 8, 2, 64, 64, 2
    seqlens = torch.tensor([20, 45], dtype=torch.int32)
    g = torch.Generator().manual_seed(21)
    q = torch.randn((b, sq, hq, d), generator=g, dtype=torch.float32).to(torch.bfloat16)
    k_new = torch.randn((b, s_new, hk, d), generator=g).to(torch.bfloat16)
    v_new = torch.randn((b, s_new, hk, d), generator=g).to(torch.bfloat16)
    k_float, v_float = torch.randn(b, cap, hk, d) * 2, torch.randn(b, cap, hk, d)
    # Twice the computed descales: headroom for the appended values.
    kd = anyattn.quantize_kv_cache(k_float, cache_dtype, "sequence").descale * 2
    vd = anyattn.quantize_kv_cache(v_float, cache_dtype, "sequence").descale * 2
    k_cache = anyattn.quantize_kv_cache(k_float, cache_dtype, "sequence", descale=kd).cache
    v_cache = anyattn.quantize_kv_cache(v_float, cache_dtype, "sequence", descale=vd).cache
    q8 = q.to(cache_dtype)
    qd = _descale("sequence", b, hk, 22) if with_q_descale else None
    kw = dict(k_descale=kd, v_descale=vd, q_descale=qd)
    if paged:
        page = 16
        table = torch.randperm(b * cap // page, generator=g).to(torch.int32).reshape(b, -1)

        def scatter(x):
            out = torch.empty((b * cap // page, page) + tuple(x.shape[2:]), dtype=x.dtype)
            for i in range(b):
                for p in range(cap // page):
                    out[table[i, p]] = x[i, p * page:(p + 1) * page]
            return out

        def gather(x):
            return x[table.long()].reshape(b, cap, *x.shape[2:])

        k_store, v_store = scatter(k_cache), scatter(v_cache)
        kw["page_table"] = table
    else:
        k_store, v_store = k_cache.clone(), v_cache.clone()

        def gather(x):
            return x
    out, lse, *_ = fa3.flash_attn_with_kvcache(q8, k_store, v_store, k_new, v_new,
                                               cache_seqlens=seqlens, causal=True,
                                               return_softmax_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    k_after = anyattn.dequantize_kv_cache(gather(k_store), kd).double()
    v_after = anyattn.dequantize_kv_cache(gather(v_store), vd).double()
    qq = _dequantized(q8, qd, b, hk)
    for i in range(b):
        n = int(seqlens[i]) + s_new
        one = slice(i, i + 1)
        _check(out[one], lse[one], qq[one], k_after[one, :n], v_after[one, :n], causal=True)


@pytest.mark.parametrize("fn, name", [(fn, name)
                                      for fn in ("flash_attn_func", "flash_attn_varlen_func")
                                      for name in ("q_descale", "k_descale", "v_descale")]
                         + [("flash_attn_with_kvcache", "q_descale")])
def test_descales_of_float_inputs_raise_naming_them(fn, name):
    """(The cache call's k_descale/v_descale of a float cache: test_fa3_fa4_interface.py.)"""
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    calls = {
        "flash_attn_func": lambda **kw: fa3.flash_attn_func(q, k, v, **kw),
        "flash_attn_varlen_func": lambda **kw: fa3.flash_attn_varlen_func(
            q[0], k[0], v[0], torch.tensor([0, 4]).int(), torch.tensor([0, 4]).int(), 4, 4, **kw),
        "flash_attn_with_kvcache": lambda **kw: fa3.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=4, **kw),
    }
    calls[fn](**{name: None})  # the default is accepted
    given_for = "float32 queries" if fn == "flash_attn_with_kvcache" else "float32 inputs"
    with pytest.raises(ValueError, match=rf"^{name}: given for {given_for}"):
        calls[fn](**{name: torch.ones(1, 2)})


def test_bad_fp8_calls_raise_naming_the_argument():
    q8, k8, v8 = _inputs(torch.float8_e4m3fn, 1, 4, 4, 2, 2, 16)
    with pytest.raises(TypeError, match=r"^q: dtype torch.bfloat16 in FA3's FP8 call style"):
        fa3.flash_attn_func(q8.to(torch.bfloat16), k8, v8)
    with pytest.raises(TypeError, match=r"^v: dtype torch.bfloat16 in FA3's FP8 call style"):
        fa3.flash_attn_func(q8, k8, v8.to(torch.bfloat16))
    with pytest.raises(NotImplementedError, match=r"^qv: not supported by anyattn with float8"):
        fa3.flash_attn_func(q8, k8, v8, qv=q8)
    with pytest.raises(ValueError, match=r"^q_descale: entry \(0, 1\) is nan; supported: finite"):
        fa3.flash_attn_func(q8, k8, v8, q_descale=torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match=r"^q_descale: shape \(3,\) is not supported"):
        fa3.flash_attn_func(q8, k8, v8, q_descale=torch.ones(3))
    with pytest.raises(TypeError, match=r"^q: float8 queries \(torch.float8_e4m3fn\) read an "
                                        r"8-bit KV cache; k_cache is torch.bfloat16"):
        fa3.flash_attn_with_kvcache(q8, k8.to(torch.bfloat16), v8.to(torch.bfloat16),
                                    cache_seqlens=4)


def test_float8_new_keys_are_rejected_naming_them():
    """The cache call quantizes new keys and values itself: they come as float32, float16 or
    bfloat16, also when float8 q has a q_descale (q then runs in float32)."""
    cache = torch.zeros(1, 8, 2, 16, dtype=torch.float8_e4m3fn)
    q8 = torch.randn(1, 1, 2, 16).to(torch.float8_e4m3fn)
    new = torch.randn(1, 1, 2, 16).to(torch.float8_e4m3fn)
    for q_descale in (None, torch.ones(1, 2)):
        with pytest.raises(TypeError, match=r"^k: dtype torch.float8_e4m3fn is not supported"):
            fa3.flash_attn_with_kvcache(q8, cache, cache.clone(), new, new, cache_seqlens=3,
                                        q_descale=q_descale)


def test_fp8_calls_have_no_backward():
    q8, k8, v8 = _inputs(torch.float8_e4m3fn, 1, 4, 4, 2, 2, 16)
    q8.requires_grad_(True)
    out = fa3.flash_attn_func(q8, k8, v8)
    with pytest.raises(NotImplementedError):
        out.float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("wide", [torch.bfloat16, torch.float32])
def test_widening_is_torchs_conversion_for_every_code(dtype, wide):
    """The table widening (_core.widen_codes for bfloat16) gives torch's own conversion for all
    256 codes, NaN codes included, and for odd sizes and strided inputs."""
    from anyattn._fa3_fp8 import widened

    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    for x in (codes, codes[:13], codes.reshape(16, 16)[:, ::3], codes[:0]):
        got, want = widened(x, wide), x.to(wide)
        assert got.shape == want.shape and got.dtype == wide
        assert bool(((got == want) | (got.isnan() & want.isnan())).all())


# ---- FlashAttention 4's functions with float8 inputs -------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT8, ids=_name)
def test_fa4_func_with_float8_inputs(dtype):
    """FA4 takes float8 q, k and v with unit descales: the FP8 route's result, LSE included."""
    from anyattn import fa4_interface as fa4

    q, k, v = _inputs(dtype, 2, 5, 9, 4, 2, 32, seed=40)
    sink = torch.randn(4, generator=torch.Generator().manual_seed(41))
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
    assert lse.shape == (2, 4, 5)
    _check(out, lse, q.double(), k.double(), v.double(), causal=True, sinks=sink.double().numpy())
    want = fa3.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    assert torch.equal(out, want)
    assert fa4.flash_attn_func(q, k, v, causal=True)[1] is None


def test_fa4_varlen_with_float8_inputs_packed_and_paged():
    from anyattn import fa4_interface as fa4

    q, k, v = _inputs(torch.float8_e4m3fn, 1, 7, 12, 4, 1, 32, seed=42)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    out, lse = fa4.flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                          causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.shape == (4, 7)
    for b in range(2):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        _check(out[rq][None], lse[:, rq][None], q[0, rq][None].double(), k[0, rk][None].double(),
               v[0, rk][None].double(), causal=True)
    table = torch.tensor([[2, 0], [1, 2]], dtype=torch.int32)  # pages of 4 keys from k's 12
    pages_k, pages_v = k[0].reshape(3, 4, 1, 32), v[0].reshape(3, 4, 1, 32)
    used = torch.tensor([6, 8], dtype=torch.int32)
    out, _ = fa4.flash_attn_varlen_func(q[0], pages_k, pages_v, cu_seqlens_q=cu_q,
                                        page_table=table, seqused_k=used)
    for b in range(2):
        rows = torch.cat([pages_k[int(p)] for p in table[b]])[:int(used[b])]
        vals = torch.cat([pages_v[int(p)] for p in table[b]])[:int(used[b])]
        rq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        _check(out[rq][None], None, q[0, rq][None].double(), rows[None].double(),
               vals[None].double())


def test_fa4_float8_with_qv_or_gather_is_rejected_naming_them():
    from anyattn import fa4_interface as fa4

    q, k, v = _inputs(torch.float8_e4m3fn, 1, 2, 4, 2, 1, 16, seed=43)
    with pytest.raises(NotImplementedError, match="^qv: not supported by anyattn with float8"):
        fa4.flash_attn_func(q, k, v, q)
    with pytest.raises(NotImplementedError, match="^gather_kv_indices: not supported by anyattn"):
        fa4.flash_attn_func(q, k, v, gather_kv_indices=torch.zeros((1, 2, 3), dtype=torch.int32))
