"""The largest head dims (D = 576, Dv = 512) and absorbed-MLA decode from Python.

flash_attn_func at D = 576 / Dv = 512 (forward and autograd) against float64 torch math by the
2x rule; flash_attn_with_kvcache with one latent cache passed as both k_cache and v_cache
(v_cache = latent[..., :512], the way FlashMLA, vLLM and sglang call it), contiguous and paged,
with and without appending new tokens given as one latent row (k = new, v = new[..., :512]), for
16 and 128 query heads; and head dims past the limits rejected before any backend runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from reference import attention_ref, check_2x, lse_eps, out_eps

torch = pytest.importorskip("torch")
from torch_reference import attention_torch, grads_2x, leaf, naive_gradients  # noqa: E402

D, DV = 576, 512


def _f64(t):
    return t.to(torch.float64).numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_at_the_largest_head_dims(dtype, causal):
    g = torch.Generator().manual_seed(3)
    tdt = getattr(torch, dtype)
    q = torch.randn(2, 5, 4, D, generator=g).to(tdt)
    k = torch.randn(2, 70, 2, D, generator=g).to(tdt)
    v = torch.randn(2, 70, 2, DV, generator=g).to(tdt)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == (2, 5, 4, DV) and out.dtype == tdt
    ref, ref_lse = attention_torch(q.double(), k.double(), v.double(), causal=causal,
                                   return_lse=True)
    naive, naive_lse = attention_ref(_f64(q), _f64(k), _f64(v), causal=causal, dtype=dtype)
    check_2x("out", _f64(out), ref.numpy(), naive, out_eps(dtype, ref.numpy()))
    check_2x("lse", lse.double().numpy(), ref_lse.numpy(), naive_lse, lse_eps(ref_lse.numpy()))


def test_autograd_at_the_largest_head_dims():
    g = torch.Generator().manual_seed(4)
    tdt = torch.bfloat16
    q, k = (torch.randn(1, s, h, D, generator=g).to(tdt).double() for s, h in ((33, 2), (40, 1)))
    v = torch.randn(1, 40, 1, DV, generator=g).to(tdt).double()
    dout = torch.randn(1, 33, 2, DV, generator=g).to(tdt).double()
    ins64 = [leaf(x, torch.float64) for x in (q, k, v)]
    out64 = attention_torch(*ins64, causal=True)
    ref = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out64, ins64, dout)))
    naive = dict(zip(("dq", "dk", "dv"), naive_gradients(q, k, v, dout, dtype=tdt, causal=True)))
    ins = [leaf(x, tdt) for x in (q, k, v)]
    out = anyattn.flash_attn_func(*ins, causal=True)
    got = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, ins, dout.to(tdt))))
    grads_2x(got, ref, naive, "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("sq,append", [(1, False), (1, True), (4, True)])
@pytest.mark.parametrize("hq", [16, 128])
def test_mla_decode_on_a_shared_latent_cache(dtype, paged, sq, append, hq):
    """Hq = 16 (DeepSeek-V2-Lite) or 128 (DeepSeek-V3: more rows than one task holds, so tasks of
    several heads on the packed path) query heads against one latent kv head; v_cache is a view
    of k_cache."""
    g = torch.Generator().manual_seed(7 + sq + 2 * append + 4 * paged)
    tdt = getattr(torch, dtype)
    b, cap, page = 2, 144, 16
    seqlens = torch.tensor([70, 129], dtype=torch.int32)
    latent_log = torch.randn(b, cap, 1, D, generator=g).to(tdt)  # logical cache
    q = torch.randn(b, sq, hq, D, generator=g).to(tdt)
    new = torch.randn(b, sq, 1, D, generator=g).to(tdt) if append else None
    kw = {}
    if paged:
        blocks = b * cap // page
        table = torch.randperm(blocks + 2, generator=g)[:blocks].to(torch.int32).reshape(b, -1)
        latent = torch.zeros((blocks + 2, page, 1, D), dtype=tdt)
        for bi in range(b):
            for p in range(cap // page):
                latent[table[bi, p]] = latent_log[bi, p * page:(p + 1) * page]
        kw["block_table"] = table
    else:
        latent = latent_log.clone()
    if append:
        kw.update(k=new, v=new[..., :DV])
    before = latent.clone()
    out, lse = anyattn.flash_attn_with_kvcache(
        q, latent, latent[..., :DV], cache_seqlens=seqlens, causal=sq > 1,
        return_softmax_lse=True, **kw)
    assert out.shape == (b, sq, hq, DV) and out.dtype == tdt

    s_new = sq if append else 0
    # The cache after the call: the new latent rows, bit for bit, where they go; nothing else.
    expected = before.clone()
    for bi in range(b):
        for t in range(s_new):
            p = int(seqlens[bi]) + t
            n, r = (int(table[bi, p // page]), p % page) if paged else (bi, p)
            expected[n, r] = new[bi, t]
    assert torch.equal(latent, expected)
    ref_out, naive_out = np.zeros((b, sq, hq, DV)), np.zeros((b, sq, hq, DV))
    ref_lse, naive_lse = np.zeros((b, hq, sq)), np.zeros((b, hq, sq))
    for bi in range(b):
        s0 = int(seqlens[bi])
        rows = latent_log[bi, :s0]
        if append:
            rows = torch.cat([rows, new[bi]])
        keys = _f64(rows)[None]
        o, l = attention_torch(q[bi:bi + 1].double(), torch.from_numpy(keys),
                               torch.from_numpy(keys[..., :DV]), causal=sq > 1, return_lse=True)
        no, nl = attention_ref(_f64(q[bi:bi + 1]), keys, keys[..., :DV], causal=sq > 1,
                               dtype=dtype)
        ref_out[bi], ref_lse[bi], naive_out[bi], naive_lse[bi] = o[0], l[0], no[0], nl[0]
    check_2x("out", _f64(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", lse.double().numpy(), ref_lse, naive_lse, lse_eps(ref_lse))


def test_head_dims_past_the_limits_are_rejected():
    assert (anyattn._core.MAX_HEAD_DIM, anyattn._core.MAX_HEAD_DIM_V) == (D, DV)
    q = torch.zeros(1, 1, 1, D + 1)
    v = torch.zeros(1, 1, 1, DV)
    with pytest.raises(ValueError, match=r"q: head dimension must be in \[0, 576\], got 577"):
        anyattn.flash_attn_func(q, q, v)
    q = torch.zeros(1, 1, 1, D)
    v = torch.zeros(1, 1, 1, DV + 1)
    with pytest.raises(ValueError, match=r"v: head dimension must be in \[0, 512\], got 513"):
        anyattn.flash_attn_func(q, q, v)
