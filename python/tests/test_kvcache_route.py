"""The off-CPU route of flash_attn_with_kvcache (anyattn._kvcache_route), run on CPU tensors so
that CI checks it against anyattn's KV-cache kernel: the caches must end up holding the same rows
and the outputs (and LSE) must agree, for contiguous and paged caches, rotary, cache_batch_idx,
cache_leftpad and the score features; plus the pure choice of the flash_attn package."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _dispatch  # noqa: E402
from anyattn._kvcache_route import CacheCall, kvcache_on_device  # noqa: E402
from anyattn._options import make_options  # noqa: E402

B, SQ, HQ, HK, D, S_NEW = 3, 2, 4, 2, 16, 2

FEATURES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(causal=True, window_size=(3, 0)),
    "softcap_alibi_sinks": dict(softcap=2.5, alibi=True, sinks=True, causal=True),
}


def _rotary_table(positions: int, rotary_dim: int):
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * (
        0.5 ** torch.arange(rotary_dim // 2, dtype=torch.float64))[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def _problem(layout: str, rotary, g):
    """(q, k_new, v_new, caches, kwargs for flash_attn_with_kvcache except the caches)."""
    q = torch.randn(B, SQ, HQ, D, generator=g)
    k_new, v_new = (torch.randn(B, S_NEW, HK, D, generator=g) for _ in range(2))
    kw = dict(cache_seqlens=torch.tensor([5, 0, 9], dtype=torch.int32))
    if layout == "paged":
        page, pages = 4, 3
        kw["block_table"] = torch.randperm(B * pages + 2, generator=g)[:B * pages].reshape(
            B, pages).to(torch.int32)
        shape = (B * pages + 2, page, HK, D)
    else:
        shape = (B + 1, 12, HK, D)
        kw["cache_batch_idx"] = torch.tensor([2, 0, 3], dtype=torch.int32)
        kw["cache_leftpad"] = torch.tensor([1, 0, 4], dtype=torch.int32)
    caches = [torch.randn(shape, generator=g) for _ in range(2)]
    if rotary is not None:
        cos, sin = _rotary_table(16, 8)
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary == "interleaved")
    return q, k_new, v_new, caches, kw


@pytest.mark.parametrize("want_lse", [False, True])
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_kvcache_route_equals_the_kernel(layout, rotary, feature, want_lse):
    spec = FEATURES[feature]
    g = torch.Generator().manual_seed(5)
    q, k_new, v_new, (k_cache, v_cache), kw = _problem(layout, rotary, g)
    options = make_options(0.0, None, spec.get("causal", False), spec.get("window_size", (-1, -1)),
                           spec.get("softcap", 0.0), False)
    alibi = torch.rand(B, HQ, generator=g) if spec.get("alibi") else None
    sinks = torch.randn(HQ, generator=g) if spec.get("sinks") else None
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    ref, ref_lse = anyattn.flash_attn_with_kvcache(
        q, k_ref, v_ref, k_new, v_new, causal=options.causal, window_size=options.window_size,
        softcap=options.softcap, alibi_slopes=alibi, sinks=sinks, return_softmax_lse=True, **kw)
    call = CacheCall(k_cache, v_cache, k_new, v_new, kw.get("rotary_cos"), kw.get("rotary_sin"),
                     kw["cache_seqlens"], -1, kw.get("cache_batch_idx"), kw.get("cache_leftpad"),
                     kw.get("block_table"), kw.get("rotary_interleaved", True))
    out, lse = kvcache_on_device(q, call, options, alibi, sinks, 0, want_lse)
    torch.testing.assert_close(k_cache, k_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    if want_lse or lse is not None:
        torch.testing.assert_close(lse, ref_lse, rtol=2e-5, atol=2e-5)


def test_kvcache_route_without_new_keys_and_int_seqlen():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, 1, HQ, D, generator=g)
    k_cache, v_cache = (torch.randn(B, 10, HK, D, generator=g) for _ in range(2))
    ref = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=7, causal=True)
    call = CacheCall(k_cache, v_cache, None, None, None, None, None, 7, None, None, None, True)
    out, _ = kvcache_on_device(q, call, make_options(0.0, None, True, (-1, -1), 0.0, False),
                               None, None, 0, False)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("page, expected", [(0, _dispatch.FLASH_ATTN), (256, _dispatch.FLASH_ATTN),
                                            (16, _dispatch.SDPA)])
def test_kvcache_route_choice_needs_flash_attn_page_sizes(page, expected):
    call = _dispatch.CallFeatures(dtype="float16", head_dim=128, head_dim_v=128, paged_block_size=page)
    env = _dispatch.Environment(flash_attn_version="2.8.3", cuda_capability=(8, 0))
    assert _dispatch.select_backend("cuda", call, env).backend == expected
