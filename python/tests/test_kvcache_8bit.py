"""8-bit KV caches (float8_e4m3fn, float8_e5m2, int8) in the cache calls: attention against the
dequantized cache, the append's quantization (byte-identical to anyattn.quantize_kv_cache), paged
caches, rotary, FA3's and paged varlen's entry points, and the errors for bad scales."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from reference import attention_ref, check_2x, lse_eps, out_eps

torch = pytest.importorskip("torch")
fa3 = pytest.importorskip("anyattn.fa3_interface")

CACHE_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
Q_DTYPES = ["float32", "float16", "bfloat16"]
GRANULARITIES = [None, "tensor", "head", "sequence", "token"]


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _rotary_table(positions, rotary_dim):
    t = np.arange(positions)[:, None] * 10000.0 ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    return torch.from_numpy(np.cos(t).astype(np.float32)), torch.from_numpy(
        np.sin(t).astype(np.float32))


def _rotate(x, cos, sin, interleaved):
    """x (S, H, D) float64 rotated by cos/sin (S, rotary_dim/2), float64 throughout."""
    x = x.clone()
    rd = cos.shape[1] * 2
    c, s = cos[:, None, :].double(), sin[:, None, :].double()
    if interleaved:
        a, b = x[..., 0:rd:2].clone(), x[..., 1:rd:2].clone()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : rd // 2].clone(), x[..., rd // 2: rd].clone()
        x[..., : rd // 2], x[..., rd // 2: rd] = a * c - b * s, a * s + b * c
    return x


def _quantized(x, dtype, granularity):
    """(cache, descale, token_scale) of a logical float cache at a granularity: None gives no
    scales (the values rounded into dtype directly); the coarse granularities get twice the
    computed descale, headroom for the appended values, which they do not adapt to."""
    if granularity is None:
        return anyattn.quantize_kv_cache(x, dtype, "tensor", descale=1.0).cache, None, None
    if granularity == "token":
        return tuple(anyattn.quantize_kv_cache(x, dtype, "token"))
    descale = anyattn.quantize_kv_cache(x, dtype, granularity).descale * 2
    return tuple(anyattn.quantize_kv_cache(x, dtype, granularity, descale=descale))


def _appended(new, dtype, granularity, descale):
    """What the append stores for new keys/values (no rotary): quantize_kv_cache's bytes."""
    if granularity is None:
        return anyattn.quantize_kv_cache(new.float(), dtype, "tensor", descale=1.0).cache
    if granularity == "token":
        return anyattn.quantize_kv_cache(new.float(), dtype, "token").cache
    return anyattn.quantize_kv_cache(new.float(), dtype, granularity, descale=descale).cache


class Paging:
    """Scatters logical (B, cap, Hk, ...) tensors into pages of a shuffled block table."""

    def __init__(self, rng, batch, cap, page):
        self.page, self.blocks = page, batch * cap // page
        perm = rng.permutation(self.blocks + 2)[: self.blocks].astype(np.int32)
        self.table = torch.from_numpy(perm.reshape(batch, cap // page))

    def scatter(self, logical):
        out = torch.zeros((self.blocks + 2, self.page) + tuple(logical.shape[2:]),
                          dtype=logical.dtype)
        for b in range(self.table.shape[0]):
            for p in range(self.table.shape[1]):
                out[self.table[b, p]] = logical[b, p * self.page:(p + 1) * self.page]
        return out

    def gather(self, paged):
        rows = paged[self.table.long()]  # (B, max_blocks, page, ...)
        return rows.reshape(rows.shape[0], -1, *rows.shape[3:])


def _dequantized(cache, descale, token_scale):
    """float64 (B, cap, Hk, D) values of a logical 8-bit cache: stored * (descale * token_scale)
    in float32, as the kernel reads it."""
    return anyattn.dequantize_kv_cache(cache, descale, token_scale).double()


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_and_attend_matches_the_dequantized_cache(cache_dtype, q_dtype, granularity,
                                                         paged):
    rng = np.random.default_rng(11)
    b, sq, hq, hk, d, cap, s_new = 2, 2, 4, 2, 32, 32, 2
    seqlens = torch.tensor([5, 20], dtype=torch.int32)
    tdt = getattr(torch, q_dtype)
    q = torch.from_numpy(rng.standard_normal((b, sq, hq, d))).to(tdt)
    k_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d))).to(tdt)
    v_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d)) * 3).to(tdt)
    k_log, k_descale, k_token = _quantized(torch.randn(b, cap, hk, d) * 2, cache_dtype,
                                           granularity)
    v_log, v_descale, v_token = _quantized(torch.randn(b, cap, hk, d), cache_dtype, granularity)
    kw = dict(k_descale=k_descale, v_descale=v_descale)
    if paged:
        paging = Paging(rng, b, cap, 8)
        k_cache, v_cache = paging.scatter(k_log), paging.scatter(v_log)
        if k_token is not None:
            kw.update(k_token_scale=paging.scatter(k_token), v_token_scale=paging.scatter(v_token))
        kw["block_table"] = paging.table
    else:
        k_cache, v_cache = k_log.clone(), v_log.clone()
        if k_token is not None:
            kw.update(k_token_scale=k_token.clone(), v_token_scale=v_token.clone())
    out, lse = anyattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True,
        return_softmax_lse=True, **kw)
    assert out.dtype == tdt and out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)

    def logical(t):
        return None if t is None else (paging.gather(t) if paged else t)

    k_after = _dequantized(logical(k_cache), k_descale, logical(kw.get("k_token_scale")))
    v_after = _dequantized(logical(v_cache), v_descale, logical(kw.get("v_token_scale")))
    k_before = _dequantized(k_log, k_descale, k_token)
    k_stored, v_stored = logical(k_cache), logical(v_cache)
    for name, new, stored, descale in (("k", k_new, k_stored, k_descale),
                                       ("v", v_new, v_stored, v_descale)):
        for bi in range(b):
            s0 = int(seqlens[bi])
            want = _appended(new[bi:bi + 1], cache_dtype, granularity,
                             descale[bi:bi + 1] if granularity == "sequence" else descale)
            assert torch.equal(stored[bi:bi + 1, s0:s0 + s_new].view(torch.uint8),
                               want.view(torch.uint8)), f"{name} appended to sequence {bi}"
    ref_out, naive_out = np.zeros((b, sq, hq, d)), np.zeros((b, sq, hq, d))
    ref_lse, naive_lse = np.zeros((b, hq, sq)), np.zeros((b, hq, sq))
    for bi in range(b):
        n = int(seqlens[bi]) + s_new
        # Untouched positions kept their values.
        assert torch.equal(k_after[bi, :n - s_new], k_before[bi, :n - s_new])
        keys, vals = k_after[bi, :n].numpy(), v_after[bi, :n].numpy()
        qb = q[bi].double().numpy()
        o, l = attention_ref(qb[None], keys[None], vals[None], causal=True)
        no, nl = attention_ref(qb[None], keys[None], vals[None], causal=True, dtype=q_dtype)
        ref_out[bi], ref_lse[bi], naive_out[bi], naive_lse[bi] = o[0], l[0], no[0], nl[0]
    check_2x("out", out.double().numpy(), ref_out, naive_out, out_eps(q_dtype, ref_out))
    check_2x("lse", lse.numpy(), ref_lse, naive_lse, lse_eps(ref_lse))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
@pytest.mark.parametrize("granularity", ["tensor", "head", "sequence", "token"])
def test_append_stores_the_bytes_quantize_kv_cache_computes(cache_dtype, granularity):
    rng = np.random.default_rng(3)
    b, hk, d, cap, s_new = 2, 2, 16, 8, 3
    k_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d)).astype(np.float32) * 5)
    v_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d)).astype(np.float32))
    # Rounding ties, saturation and non-finite values in one row of each.
    edge = [0.5, 1.5, 2.5, -0.5, 1.0625, 1.1875, 200.0, -300.0, 1e6, float("inf"),
            -float("inf"), 0.0, -0.0, 3.0, 100.5, 101.5]
    k_new[0, 0, 0] = torch.tensor(edge)
    v_new[1, 2, 1] = 0.0  # an all-zero row: token scale 0, stored zeros
    if granularity == "token":
        k_descale = v_descale = None
    else:
        shape = {"tensor": (1,), "head": (hk,), "sequence": (b, hk)}[granularity]
        k_descale = torch.from_numpy(rng.uniform(0.5, 2.0, shape).astype(np.float32))
        v_descale = torch.from_numpy(rng.uniform(0.5, 2.0, shape).astype(np.float32))
        if granularity == "tensor":
            k_descale[0] = 1.0  # the edge row's values exactly as given
    k_cache = torch.zeros((b, cap, hk, d), dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    kw = {}
    if granularity == "token":
        kw = dict(k_token_scale=torch.zeros((b, cap, hk)), v_token_scale=torch.zeros((b, cap, hk)))
    q = torch.randn(b, 1, hk, d)
    anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=2,
                                    k_descale=k_descale, v_descale=v_descale, **kw)
    for name, new, cache, descale in (("k", k_new, k_cache, k_descale),
                                      ("v", v_new, v_cache, v_descale)):
        want = anyattn.quantize_kv_cache(new, cache_dtype, granularity, descale=descale)
        got = cache[:, 2:2 + s_new]
        assert torch.equal(got.view(torch.uint8), want.cache.view(torch.uint8)), name
        if granularity == "token":
            token = kw[f"{name}_token_scale"]
            assert torch.equal(token[:, 2:2 + s_new], want.token_scale), name
            assert not token[:, :2].any() and not token[:, 2 + s_new:].any()
        assert not cache[:, :2].view(torch.uint8).any()
        assert not cache[:, 2 + s_new:].view(torch.uint8).any()
    qmax = {torch.int8: 127, torch.float8_e4m3fn: 448, torch.float8_e5m2: 57344}[cache_dtype]
    if granularity == "tensor":  # descale 1: the edge row as stored
        row = k_cache[0, 2, 0].float()
        assert row[8:11].tolist() == [qmax, qmax, -qmax]  # 1e6, inf, -inf saturate
        if cache_dtype == torch.int8:
            assert row[:8].tolist() == [0.0, 2.0, 2.0, 0.0, 1.0, 1.0, 127.0, -127.0]
            assert row[14:16].tolist() == [100.0, 102.0]  # ties to even
        else:
            assert row[4:6].tolist() == [1.0, 1.25]  # ties to even
            assert float(row[6]) == 192.0  # 200 lies between 192 and 208 (e4m3) / 224 (e5m2)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
@pytest.mark.parametrize("interleaved", [True, False], ids=["gptj", "neox"])
def test_append_with_rotary_into_a_paged_token_scaled_cache(cache_dtype, interleaved):
    rng = np.random.default_rng(8)
    b, sq, hq, hk, d, cap, s_new, rd = 2, 3, 4, 2, 32, 32, 3, 16
    seqlens = torch.tensor([4, 17], dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((b, sq, hq, d)).astype(np.float32))
    k_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d)).astype(np.float32))
    v_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d)).astype(np.float32))
    k_log, _, k_tok = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype, "token")
    v_log, _, v_tok = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype, "token")
    paging = Paging(rng, b, cap, 4)
    k_cache, v_cache = paging.scatter(k_log), paging.scatter(v_log)
    k_token, v_token = paging.scatter(k_tok), paging.scatter(v_tok)
    cos, sin = _rotary_table(cap, rd)
    out, lse = anyattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        block_table=paging.table, causal=True, rotary_interleaved=interleaved,
        return_softmax_lse=True, k_token_scale=k_token, v_token_scale=v_token)
    keys_all = _dequantized(paging.gather(k_cache), None, paging.gather(k_token))
    vals_all = _dequantized(paging.gather(v_cache), None, paging.gather(v_token))
    ref_out, naive_out = np.zeros((b, sq, hq, d)), np.zeros((b, sq, hq, d))
    ref_lse, naive_lse = np.zeros((b, hq, sq)), np.zeros((b, hq, sq))
    for bi in range(b):
        s0 = int(seqlens[bi])
        rotated = _rotate(k_new[bi].double(), cos[s0:s0 + s_new], sin[s0:s0 + s_new], interleaved)
        # The appended rows are the rotated keys, quantized per (position, head).
        got = keys_all[bi, s0:s0 + s_new]
        amax = rotated.abs().amax(dim=-1, keepdim=True)
        step = {torch.int8: 1 / 127, torch.float8_e4m3fn: 2.0 ** -4,
                torch.float8_e5m2: 2.0 ** -3}[cache_dtype]
        assert bool(((got - rotated).abs() <= amax * step * 1.01).all())
        qpos = torch.arange(s0, s0 + sq)
        qb = _rotate(q[bi].double(), cos[qpos], sin[qpos], interleaved).numpy()
        n = s0 + s_new
        keys, vals = keys_all[bi, :n].numpy(), vals_all[bi, :n].numpy()
        o, l = attention_ref(qb[None], keys[None], vals[None], causal=True)
        no, nl = attention_ref(qb[None], keys[None], vals[None], causal=True, dtype="float32")
        ref_out[bi], ref_lse[bi], naive_out[bi], naive_lse[bi] = o[0], l[0], no[0], nl[0]
    check_2x("out", out.double().numpy(), ref_out, naive_out, out_eps("float32", ref_out))
    check_2x("lse", lse.numpy(), ref_lse, naive_lse, lse_eps(ref_lse))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
def test_paged_varlen_reads_an_8bit_cache(cache_dtype):
    rng = np.random.default_rng(4)
    b, hq, hk, d, cap = 3, 4, 2, 32, 24
    q_lens, k_lens = [3, 1, 5], [10, 24, 7]
    k_log, k_descale, _ = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype,
                                                    "sequence")
    v_log, _, v_tok = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype, "token")
    paging = Paging(rng, b, cap, 8)
    q = torch.randn(sum(q_lens), hq, d, dtype=torch.bfloat16)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    out = anyattn.flash_attn_varlen_func(
        q, paging.scatter(k_log), paging.scatter(v_log), cu_q, None, max(q_lens), cap,
        causal=True, block_table=paging.table, seqused_k=torch.tensor(k_lens, dtype=torch.int32),
        k_descale=k_descale, v_token_scale=paging.scatter(v_tok),
        k_token_scale=torch.ones(paging.blocks + 2, 8, hk))
    keys = _dequantized(k_log, k_descale, None)
    vals = _dequantized(v_log, None, v_tok)
    for bi in range(b):
        rows = slice(int(cu_q[bi]), int(cu_q[bi + 1]))
        qb = q[rows].double().numpy()[None]
        kb, vb = keys[bi, :k_lens[bi]].numpy()[None], vals[bi, :k_lens[bi]].numpy()[None]
        o, _ = attention_ref(qb, kb, vb, causal=True)
        no, _ = attention_ref(qb, kb, vb, causal=True, dtype="bfloat16")
        check_2x(f"out[{bi}]", out[rows].double().numpy()[None], o, no, out_eps("bfloat16", o))


def test_fa3_cache_call_takes_descales_and_matches_the_fa2_call():
    b, hq, hk, d, cap = 2, 4, 2, 16, 12
    k8, k_descale, _ = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), torch.float8_e4m3fn,
                                                 "sequence")
    v8, v_descale, _ = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), torch.float8_e4m3fn,
                                                 "head")
    q, k, v = torch.randn(b, 1, hq, d), torch.randn(b, 1, hk, d), torch.randn(b, 1, hk, d)
    k8b, v8b = k8.clone(), v8.clone()
    out3, lse3, *_ = fa3.flash_attn_with_kvcache(
        q, k8, v8, k, v, cache_seqlens=torch.tensor([3, 9], dtype=torch.int32),
        k_descale=k_descale, v_descale=v_descale, causal=True, return_softmax_lse=True)
    out2, lse2 = anyattn.flash_attn_with_kvcache(
        q, k8b, v8b, k, v, cache_seqlens=torch.tensor([3, 9], dtype=torch.int32),
        k_descale=k_descale, v_descale=v_descale, causal=True, return_softmax_lse=True)
    assert torch.equal(out3, out2) and torch.equal(lse3, lse2)
    assert torch.equal(k8.view(torch.uint8), k8b.view(torch.uint8))
    # q_descale scales float8 queries (test_fa3_fp8.py), not float32 ones.
    with pytest.raises(ValueError, match="^q_descale: given for float32 queries"):
        fa3.flash_attn_with_kvcache(q, k8, v8, q_descale=torch.ones(b, hk))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
def test_fa3_packed_cache_call_appends_and_reads_an_8bit_cache_as_fa2_calls_do(cache_dtype):
    """FA3's call with packed queries and new keys (cu_seqlens_q, cu_seqlens_k_new), rotary and a
    paged 8-bit cache (per-sequence K descales, V token scales): the same cache bytes, token
    scales and outputs as one FA2 call per sequence."""
    rng = np.random.default_rng(9)
    b, hq, hk, d, cap, page = 3, 4, 2, 32, 24, 8
    q_lens, new_lens, stored = [2, 1, 3], [1, 2, 1], [5, 0, 11]
    paging = Paging(rng, b, cap, page)
    k_log, k_descale, _ = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype,
                                                    "sequence")
    k_descale = k_descale * 2  # headroom for the appended keys
    v_log, _, v_tok = anyattn.quantize_kv_cache(torch.randn(b, cap, hk, d), cache_dtype, "token")
    k_cache, v_cache, v_token = paging.scatter(k_log), paging.scatter(v_log), paging.scatter(v_tok)
    k_token = torch.ones(v_token.shape)
    q = torch.randn(sum(q_lens), hq, d)
    k_new, v_new = torch.randn(sum(new_lens), hk, d), torch.randn(sum(new_lens), hk, d)
    cos, sin = _rotary_table(cap, 16)
    seqlens = torch.tensor(stored, dtype=torch.int32)

    def cu(lengths):
        return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)

    caches3 = [x.clone() for x in (k_cache, v_cache, k_token, v_token)]
    out3, lse3, *_ = fa3.flash_attn_with_kvcache(
        q, caches3[0], caches3[1], k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=seqlens, page_table=paging.table, cu_seqlens_q=cu(q_lens),
        cu_seqlens_k_new=cu(new_lens), max_seqlen_q=max(q_lens), rotary_interleaved=False,
        causal=True, k_descale=k_descale, k_token_scale=caches3[2], v_token_scale=caches3[3],
        return_softmax_lse=True)
    caches2 = [x.clone() for x in (k_cache, v_cache, k_token, v_token)]
    qs, ks, vs = (torch.split(x, n) for x, n in ((q, q_lens), (k_new, new_lens), (v_new, new_lens)))
    for i in range(b):
        out2, lse2 = anyattn.flash_attn_with_kvcache(
            qs[i][None], caches2[0], caches2[1], ks[i][None], vs[i][None], rotary_cos=cos,
            rotary_sin=sin,
            cache_seqlens=seqlens[i:i + 1], block_table=paging.table[i:i + 1],
            rotary_interleaved=False, causal=True, k_descale=k_descale[i:i + 1],
            k_token_scale=caches2[2], v_token_scale=caches2[3], return_softmax_lse=True)
        rows = slice(sum(q_lens[:i]), sum(q_lens[:i + 1]))
        torch.testing.assert_close(out3[rows], out2[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse3[:, rows], lse2[0], rtol=1e-6, atol=1e-6)
    for name, x3, x2 in zip(("k_cache", "v_cache"), caches3, caches2):
        assert torch.equal(x3.view(torch.uint8), x2.view(torch.uint8)), name
    assert torch.equal(caches3[3], caches2[3]) and torch.equal(caches3[2], caches2[2])


def test_quantize_kv_cache_granularities_bound_the_error():
    x = torch.randn(2, 16, 3, 8, dtype=torch.bfloat16) * torch.tensor([1.0, 10.0, 0.01])[:, None]
    for dtype in CACHE_DTYPES:
        for granularity, scale_shape, token_shape in (("tensor", (1,), None),
                                                      ("head", (3,), None),
                                                      ("sequence", (2, 3), None),
                                                      ("token", None, (2, 16, 3))):
            qc = anyattn.quantize_kv_cache(x, dtype, granularity)
            assert qc.cache.dtype == dtype and qc.cache.shape == x.shape
            assert (None if qc.descale is None else tuple(qc.descale.shape)) == scale_shape
            assert (None if qc.token_scale is None else tuple(qc.token_scale.shape)) == token_shape
            back = anyattn.dequantize_kv_cache(qc.cache, qc.descale, qc.token_scale)
            # Each group's largest value is stored at qmax, so the relative error is the format's
            # half-step at the top of its range (int8: half a unit of 127).
            half_step = {torch.int8: 0.5 / 127, torch.float8_e4m3fn: 2.0 ** -4,
                         torch.float8_e5m2: 2.0 ** -3}[dtype]
            dims = {"tensor": (0, 1, 2, 3), "head": (0, 1, 3), "sequence": (1, 3),
                    "token": (3,)}[granularity]
            amax = x.float().abs().amax(dim=dims, keepdim=True)
            assert bool(((back - x.float()).abs() <= amax * half_step * 1.001 + 1e-30).all())


def test_cache_call_with_requires_grad_raises_at_backward():
    k8, k_descale, _ = anyattn.quantize_kv_cache(torch.randn(1, 4, 1, 8), torch.int8, "tensor")
    v8, v_descale, _ = anyattn.quantize_kv_cache(torch.randn(1, 4, 1, 8), torch.int8, "tensor")
    q = torch.randn(1, 1, 1, 8, requires_grad=True)
    out = anyattn.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="no backward pass"):
        out.sum().backward()


# ---- errors ------------------------------------------------------------------------------------


def _call(**kw):
    k8 = torch.zeros(2, 6, 2, 8, dtype=torch.float8_e4m3fn)
    args = dict(q=torch.randn(2, 1, 4, 8), k_cache=k8, v_cache=k8.clone())
    args.update(kw)
    return anyattn.flash_attn_with_kvcache(**args)


@pytest.mark.parametrize("kw, error, message", [
    (dict(k_descale=torch.ones(3)), ValueError,
     r"^k_descale: shape \(3,\) is not supported; expected \(1,\) per tensor, \(Hk,\) = \(2,\)"),
    (dict(v_descale=torch.ones(2, 2, 1)), ValueError, r"^v_descale: shape \(2, 2, 1\)"),
    (dict(k_descale=torch.ones(1, dtype=torch.int32)), TypeError,
     r"^k_descale: dtype torch.int32 is not supported; descales are float32"),
    (dict(k_descale="1"), TypeError, r"^k_descale: expected a float32 tensor or a float"),
    (dict(k_token_scale=torch.ones(2, 6, 2)), ValueError,
     r"^k_token_scale, v_token_scale: give both or neither"),
    (dict(k_token_scale=torch.ones(2, 6, 2, dtype=torch.float16),
          v_token_scale=torch.ones(2, 6, 2)), TypeError,
     r"^k_token_scale: dtype torch.float16 is not supported; token scales are float32"),
    (dict(k_token_scale=torch.ones(2, 6), v_token_scale=torch.ones(2, 6, 2)), ValueError,
     r"^k_token_scale: shape \(2, 6\) does not match k_cache: expected \(2, 6, 2\)"),
    (dict(v_cache=torch.zeros(2, 6, 2, 8, dtype=torch.int8)), TypeError,
     r"^k_cache, v_cache: an 8-bit cache needs one dtype for both"),
    (dict(q_descale=torch.ones(1)), NotImplementedError, r"^q_descale: not supported by anyattn"),
    (dict(k_cache=torch.zeros(2, 6, 2, 8), v_cache=torch.zeros(2, 6, 2, 8),
          k_descale=torch.ones(1)), ValueError,
     r"^k_descale: given for a float32 KV cache; scales read 8-bit caches only"),
])
def test_bad_scales_raise_naming_the_argument(kw, error, message):
    with pytest.raises(error, match=message):
        _call(**kw)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_the_library_rejects_bad_descale_values(value):
    with pytest.raises(ValueError, match="k_descale"):
        _call(k_descale=torch.tensor([value]))


def test_appending_with_a_zero_descale_is_rejected_before_writing():
    k8 = torch.zeros(1, 4, 1, 8, dtype=torch.int8)
    v8 = torch.zeros_like(k8)
    with pytest.raises(ValueError, match="k_descale"):
        anyattn.flash_attn_with_kvcache(torch.randn(1, 1, 1, 8), k8, v8, torch.ones(1, 1, 1, 8),
                                        torch.ones(1, 1, 1, 8), cache_seqlens=1,
                                        k_descale=torch.zeros(1))
    assert not k8.any() and not v8.any()


def test_varlen_scales_without_block_table_are_rejected():
    q = torch.randn(3, 2, 8)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="^k_descale: given without block_table"):
        anyattn.flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, k_descale=torch.ones(1))


def test_numpy_calls_reject_scales():
    q = np.zeros((1, 1, 1, 8), np.float32)
    with pytest.raises(TypeError, match="8-bit caches take torch tensors"):
        anyattn.flash_attn_with_kvcache(q, q.copy(), q.copy(), k_descale=torch.ones(1))


@pytest.mark.parametrize("kw, error, message", [
    (dict(dtype=torch.float16), TypeError, r"^dtype: torch.float16 is not an 8-bit cache dtype; "
                                           r"supported: torch.float8_e4m3fn"),
    (dict(granularity="channel"), ValueError, r"^granularity: 'channel' is not supported"),
    (dict(granularity="head", descale=torch.ones(1)), ValueError,
     r"^descale: shape \(1,\) does not match granularity 'head', which expects \(2,\)"),
    (dict(descale=torch.zeros(1)), ValueError, r"^descale: every entry must be a finite normal"),
    (dict(cache=torch.zeros(2, 3, 2, 4, dtype=torch.int8)), TypeError,
     r"^cache: dtype torch.int8 is not supported; quantize a float32"),
])
def test_quantize_kv_cache_errors(kw, error, message):
    args = dict(cache=torch.randn(2, 3, 2, 4), dtype=torch.int8)
    args.update(kw)
    with pytest.raises(error, match=message):
        anyattn.quantize_kv_cache(**args)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=_name)
@pytest.mark.parametrize("granularity", ["tensor", "token"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("v_scales", ["omitted", "repeated"])
def test_mla_decode_on_an_8bit_shared_latent_cache(cache_dtype, granularity, paged, v_scales):
    """Absorbed MLA against an 8-bit latent cache (D 576 = 512 + 64, Dv 512, 16 query heads, one
    latent head) passed as both caches, V its first 512 columns with K's scales, as DeepSeek
    models are served with fp8 caches; the new latent row appended once."""
    rng = np.random.default_rng(5)
    b, hq, d, dv, cap, page = 2, 16, 576, 512, 96, 16
    seqlens = torch.tensor([40, 77], dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((b, 1, hq, d))).to(torch.bfloat16)
    new = torch.from_numpy(rng.standard_normal((b, 1, 1, d))).to(torch.bfloat16)
    lat_log, descale, token = _quantized(torch.randn(b, cap, 1, d), cache_dtype, granularity)
    kw = dict(k_descale=descale)
    if v_scales == "repeated":
        kw["v_descale"] = None if descale is None else descale.clone()
    if paged:
        paging = Paging(rng, b, cap, page)
        latent = paging.scatter(lat_log)
        kw["block_table"] = paging.table
    else:
        latent = lat_log.clone()
    if token is not None:
        kw["k_token_scale"] = paging.scatter(token) if paged else token.clone()
        if v_scales == "repeated":
            kw["v_token_scale"] = kw["k_token_scale"]
    out, lse = anyattn.flash_attn_with_kvcache(
        q, latent, latent[..., :dv], new, new[..., :dv], cache_seqlens=seqlens,
        return_softmax_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == (b, 1, hq, dv)

    def logical(t):
        return None if t is None else (paging.gather(t) if paged else t)

    stored = logical(latent)
    after = _dequantized(stored, descale, logical(kw.get("k_token_scale")))
    before = _dequantized(lat_log, descale, token)
    ref_out, naive_out = np.zeros((b, 1, hq, dv)), np.zeros((b, 1, hq, dv))
    ref_lse, naive_lse = np.zeros((b, hq, 1)), np.zeros((b, hq, 1))
    for bi in range(b):
        s0 = int(seqlens[bi])
        want = _appended(new[bi:bi + 1], cache_dtype, granularity, descale)
        assert torch.equal(stored[bi:bi + 1, s0:s0 + 1].view(torch.uint8),
                           want.view(torch.uint8)), f"latent row appended to sequence {bi}"
        assert torch.equal(after[bi, :s0], before[bi, :s0])
        keys = after[bi, :s0 + 1].numpy()
        qb = q[bi].double().numpy()
        o, l = attention_ref(qb[None], keys[None], keys[None, ..., :dv])
        no, nl = attention_ref(qb[None], keys[None], keys[None, ..., :dv], dtype="bfloat16")
        ref_out[bi], ref_lse[bi], naive_out[bi], naive_lse[bi] = o[0], l[0], no[0], nl[0]
    check_2x("out", out.double().numpy(), ref_out, naive_out, out_eps("bfloat16", ref_out))
    check_2x("lse", lse.numpy(), ref_lse, naive_lse, lse_eps(ref_lse))


def test_8bit_shared_latent_cache_rejects_scales_of_its_own_for_v():
    lat = anyattn.quantize_kv_cache(torch.randn(1, 8, 1, 64), torch.float8_e4m3fn, "token")
    q = torch.randn(1, 1, 4, 64)
    lens = torch.tensor([8], dtype=torch.int32)

    def call(**scales):
        anyattn.flash_attn_with_kvcache(q, lat.cache, lat.cache[..., :32], cache_seqlens=lens,
                                        k_token_scale=lat.token_scale, **scales)

    with pytest.raises(ValueError, match=r"v_descale: .* differs from k_descale; .*shared "
                                         r"latent cache"):
        call(k_descale=torch.tensor([0.5]), v_descale=torch.tensor([0.25]))
    with pytest.raises(ValueError, match=r"v_token_scale: not k_token_scale itself"):
        call(v_token_scale=lat.token_scale.clone())
    # The same values or the very tensor are K's scales and are accepted.
    call(k_descale=torch.tensor([0.5]), v_descale=0.5, v_token_scale=lat.token_scale)
