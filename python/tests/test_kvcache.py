"""flash_attn_with_kvcache: in-place append, rotary, paging, leftpad, return conventions, errors."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from reference import attention_ref, check_2x, lse_eps, out_eps

torch = pytest.importorskip("torch")


def _rotary_table(positions, rotary_dim):
    t = np.arange(positions)[:, None] * 10000.0 ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    return np.cos(t).astype(np.float32), np.sin(t).astype(np.float32)


def _rotate(x, cos, sin, interleaved):
    """x (S, H, D) float64 rotated by cos/sin (S, rotary_dim/2)."""
    x = x.copy()
    rd = cos.shape[1] * 2
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : rd // 2].copy(), x[..., rd // 2: rd].copy()
        x[..., : rd // 2], x[..., rd // 2: rd] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("causal", [False, True])
def test_append_and_attend_matches_reference(dtype, paged, rotary, causal):
    rng = np.random.default_rng(5)
    b, sq, hq, hk, d, cap, s_new = 2, 2, 4, 2, 32, 48, 2
    seqlens = np.array([7, 30], np.int32)
    tdt = getattr(torch, dtype)
    q = torch.from_numpy(rng.standard_normal((b, sq, hq, d))).to(tdt)
    k_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d))).to(tdt)
    v_new = torch.from_numpy(rng.standard_normal((b, s_new, hk, d))).to(tdt)
    k_log = torch.from_numpy(rng.standard_normal((b, cap, hk, d))).to(tdt)  # logical caches
    v_log = torch.from_numpy(rng.standard_normal((b, cap, hk, d))).to(tdt)
    kw = {}
    if paged:
        page = 16
        blocks = b * cap // page
        perm = rng.permutation(blocks + 2)[:blocks].astype(np.int32)
        table = torch.from_numpy(perm.reshape(b, cap // page))
        k_cache = torch.zeros((blocks + 2, page, hk, d), dtype=tdt)
        v_cache = torch.zeros_like(k_cache)
        for bi in range(b):
            for p in range(cap // page):
                k_cache[table[bi, p]] = k_log[bi, p * page:(p + 1) * page]
                v_cache[table[bi, p]] = v_log[bi, p * page:(p + 1) * page]
        kw["block_table"] = table
    else:
        k_cache, v_cache = k_log.clone(), v_log.clone()
    rd = 16
    cos, sin = _rotary_table(cap, rd)
    if rotary:
        kw.update(rotary_cos=torch.from_numpy(cos), rotary_sin=torch.from_numpy(sin),
                  rotary_interleaved=rotary == "interleaved")
    before_k = k_cache.clone()
    out, lse = anyattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.from_numpy(seqlens), causal=causal,
        return_softmax_lse=True, **kw)
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq) and out.dtype == tdt

    def f64(t):
        return t.to(torch.float64).numpy()

    ref_out, naive_out = np.zeros((b, sq, hq, d)), np.zeros((b, sq, hq, d))
    ref_lse, naive_lse = np.zeros((b, hq, sq)), np.zeros((b, hq, sq))
    for bi in range(b):
        s0 = seqlens[bi]
        kn = f64(k_new[bi])
        qb = f64(q[bi])
        if rotary:
            il = rotary == "interleaved"
            kn = _rotate(kn, cos[s0:s0 + s_new], sin[s0:s0 + s_new], il)
            qpos = np.arange(s0, s0 + sq) if causal else np.full(sq, s0)
            qb = _rotate(qb, cos[qpos], sin[qpos], il)
        keys = np.concatenate([f64(k_log[bi, :s0]), kn])
        vals = np.concatenate([f64(v_log[bi, :s0]), f64(v_new[bi])])
        # The appended cache rows hold the (rotated) new keys, rounded once to the dtype.
        page_rows = [(kw["block_table"][bi, p // 16].item(), p % 16) if paged else (bi, p)
                     for p in range(s0, s0 + s_new)]
        got_rows = np.stack([f64(k_cache[n, r]) for n, r in page_rows])
        tol = (2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -23) * (np.abs(f64(k_new[bi])).max() * 2)
        np.testing.assert_allclose(got_rows, kn, rtol=0, atol=tol)
        o, l = attention_ref(qb[None], keys[None], vals[None], causal=causal)
        no, nl = attention_ref(qb[None], keys[None], vals[None], causal=causal, dtype=dtype)
        ref_out[bi], ref_lse[bi], naive_out[bi], naive_lse[bi] = o[0], l[0], no[0], nl[0]
    check_2x("out", f64(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", lse.numpy(), ref_lse, naive_lse, lse_eps(ref_lse))
    # Nothing but the appended rows changed.
    changed = (k_cache != before_k).flatten(1).any(dim=1) if paged else None
    if paged:
        written = {kw["block_table"][bi, p // 16].item() for bi in range(b)
                   for p in range(seqlens[bi], seqlens[bi] + s_new)}
        assert set(torch.nonzero(changed).flatten().tolist()) <= written


def test_scalar_cache_seqlens_and_return_convention():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 2, 8)).astype(np.float32)
    kc = rng.standard_normal((2, 10, 2, 8)).astype(np.float32)
    vc = kc.copy()  # Distinct buffers: the library rejects k_cache aliasing v_cache.
    out = anyattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=6)
    assert isinstance(out, np.ndarray) and out.shape == (2, 1, 2, 8)
    dense = anyattn.flash_attn_func(q, kc[:, :6], vc[:, :6])
    np.testing.assert_allclose(out, dense, rtol=1e-6, atol=1e-6)
    whole = anyattn.flash_attn_with_kvcache(q, kc, vc)
    np.testing.assert_allclose(whole, anyattn.flash_attn_func(q, kc, vc), rtol=1e-6, atol=1e-6)


def test_numpy_append_writes_cache_in_place():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    kc = np.zeros((1, 4, 2, 8), np.float32)
    vc = np.zeros((1, 4, 2, 8), np.float32)
    kn = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    anyattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=np.array([2], np.int32))
    np.testing.assert_array_equal(kc[0, 2], kn[0, 0])
    np.testing.assert_array_equal(kc[0, [0, 1, 3]], 0)


def test_errors_leave_the_cache_untouched():
    q = torch.randn(1, 1, 2, 8)
    kc, vc = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    kn = torch.randn(1, 2, 2, 8)
    before = kc.clone()
    with pytest.raises(ValueError, match="needs 5 cache positions"):
        anyattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=3)
    with pytest.raises(ValueError, match="block_table"):
        anyattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=1,
                                        block_table=torch.tensor([[7]], dtype=torch.int32))
    cos, sin = torch.ones(2, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="rotary_cos"):
        anyattn.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=1, rotary_cos=cos, rotary_sin=sin)
    assert torch.equal(kc, before)


def test_kvcache_op_declares_cache_mutation_and_traces():
    schema = torch.ops.anyattn.fwd_kvcache.default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    # An 8-bit cache's token scales are written by the append too (test_kvcache_8bit.py).
    assert mutated == ["k_cache", "v_cache", "k_token_scale", "v_token_scale"]

    @torch.compile(backend="eager", fullgraph=True)
    def step(q, kc, vc, kn, vn, lens):
        return anyattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)

    q, kc, vc = torch.randn(1, 1, 2, 8), torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8)
    kn = torch.randn(1, 1, 2, 8)
    out = step(q, kc, vc, kn, kn, torch.tensor([1], dtype=torch.int32))
    assert torch.equal(kc[0, 1], kn[0, 0])
    assert out.shape == (1, 1, 2, 8)


@pytest.mark.parametrize("plain", [True, False])
def test_append_bumps_the_caches_version_counters(plain):
    # The append writes the caches in place, so torch must see them as modified: autograd then
    # refuses a backward through a value saved from the cache before the append.
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 1, 2, 8, requires_grad=not plain)
    k_cache, v_cache = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    k_new = torch.randn(1, 1, 2, 8)
    versions = (k_cache._version, v_cache._version)
    anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=k_new.clone(),
                                    cache_seqlens=torch.tensor([2], dtype=torch.int32))
    assert k_cache._version > versions[0] and v_cache._version > versions[1]
    # A call that only reads leaves them alone.
    versions = (k_cache._version, v_cache._version)
    anyattn.flash_attn_with_kvcache(q, k_cache, v_cache,
                                    cache_seqlens=torch.tensor([3], dtype=torch.int32))
    assert (k_cache._version, v_cache._version) == versions
