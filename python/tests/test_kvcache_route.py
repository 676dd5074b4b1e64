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


KV8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "int8": torch.int8}


def _kv8_scales(granularity: str, cache_shape, g):
    """(k_descale, v_descale, k_token_scale, v_token_scale) of an 8-bit cache: random positive
    descales of the granularity's shape ((Hk,) per head, (B, Hk) per sequence), or token scales of
    the cache's (rows, positions, Hk) shape."""
    if granularity == "token":
        return (None, None, *(torch.rand(cache_shape[:3], generator=g) + 0.25 for _ in range(2)))
    shape = (HK,) if granularity == "head" else (B, HK)
    return (*(torch.rand(shape, generator=g) + 0.5 for _ in range(2)), None, None)


@pytest.mark.parametrize("granularity", ["token", "head", "sequence"])
@pytest.mark.parametrize("rotary", [None, "neox"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("cache_dtype", sorted(KV8_DTYPES))
def test_kvcache_route_reads_and_appends_an_8bit_cache_like_the_kernel(cache_dtype, layout, rotary,
                                                                      granularity):
    """The route quantizes the new rows into the same bytes (and token scales) as the library's
    append, and attends over the dequantized rows as the kernel does."""
    g = torch.Generator().manual_seed(7)
    q, k_new, v_new, caches, kw = _problem(layout, rotary, g)
    dtype = KV8_DTYPES[cache_dtype]
    k_cache, v_cache = (anyattn.quantize_kv_cache(c * 2, dtype, "tensor", descale=1.0).cache
                        for c in caches)
    scales = _kv8_scales(granularity, k_cache.shape, g)
    names = ("k_descale", "v_descale", "k_token_scale", "v_token_scale")
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    ref_scales = [None if s is None else s.clone() for s in scales]
    ref, ref_lse = anyattn.flash_attn_with_kvcache(
        q, k_ref, v_ref, k_new, v_new, causal=True, return_softmax_lse=True,
        **dict(zip(names, ref_scales)), **kw)
    checked = anyattn._kv_scales.cache_scales(k_cache, v_cache, B, *scales)
    call = CacheCall(k_cache, v_cache, k_new, v_new, kw.get("rotary_cos"), kw.get("rotary_sin"),
                     kw["cache_seqlens"], -1, kw.get("cache_batch_idx"), kw.get("cache_leftpad"),
                     kw.get("block_table"), kw.get("rotary_interleaved", True), checked)
    out, lse = kvcache_on_device(q, call, make_options(0.0, None, True, (-1, -1), 0.0, False),
                                 None, None, 0, True)
    # Rotated in float32 on both sides: these inputs round to the same bytes (an ulp's difference
    # between the two rotations could move a value across a rounding boundary, which the fixed
    # inputs here do not meet).
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    if granularity == "token":
        assert torch.equal(scales[3], ref_scales[3])
        assert torch.equal(scales[2], ref_scales[2])
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("granularity", ["token", "head"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("cache_dtype", sorted(KV8_DTYPES))
def test_kvcache_route_appends_and_reads_an_8bit_shared_latent_cache_like_the_kernel(
        cache_dtype, layout, granularity):
    """Absorbed MLA's shared latent cache (v_cache = k_cache[..., :Dv], v_new = k_new[..., :Dv]):
    the route writes each new row once, with K's scales (the token scale from all D columns), and
    reads V as the K rows' prefix, as the kernel does."""
    g = torch.Generator().manual_seed(9)
    q, k_new, _, caches, kw = _problem(layout, None, g)
    dv = D // 2
    dtype = KV8_DTYPES[cache_dtype]
    latent = anyattn.quantize_kv_cache(caches[0] * 2, dtype, "tensor", descale=1.0).cache
    k_descale, _, k_token, _ = _kv8_scales(granularity, latent.shape, g)
    ref_latent, ref_token = latent.clone(), None if k_token is None else k_token.clone()
    ref, ref_lse = anyattn.flash_attn_with_kvcache(
        q, ref_latent, ref_latent[..., :dv], k_new, k_new[..., :dv], causal=True,
        return_softmax_lse=True, k_descale=k_descale, k_token_scale=ref_token, **kw)
    checked = anyattn._kv_scales.cache_scales(latent, latent[..., :dv], B, k_descale, None,
                                              k_token, None)
    call = CacheCall(latent, latent[..., :dv], k_new, k_new[..., :dv], None, None,
                     kw["cache_seqlens"], -1, kw.get("cache_batch_idx"), kw.get("cache_leftpad"),
                     kw.get("block_table"), True, checked)
    out, lse = kvcache_on_device(q, call, make_options(0.0, None, True, (-1, -1), 0.0, False),
                                 None, None, 0, True)
    assert torch.equal(latent.view(torch.uint8), ref_latent.view(torch.uint8))
    if k_token is not None:
        assert torch.equal(k_token, ref_token)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=2e-5, atol=2e-5)


def test_kvcache_route_checks_descale_values_before_writing():
    g = torch.Generator().manual_seed(3)
    q, k_new, v_new, caches, kw = _problem("contiguous", None, g)
    k_cache, v_cache = (c.to(torch.float8_e4m3fn) for c in caches)
    before = k_cache.clone()
    for descale, appending, message in ((torch.tensor([0.0]), True, "normal positive"),
                                        (torch.tensor([float("nan")]), False, "finite and >= 0")):
        checked = anyattn._kv_scales.cache_scales(k_cache, v_cache, B, descale, None)
        call = CacheCall(k_cache, v_cache, k_new if appending else None,
                         v_new if appending else None, None, None, kw["cache_seqlens"], -1,
                         kw["cache_batch_idx"], kw["cache_leftpad"], None, True, checked)
        with pytest.raises(ValueError, match=r"^k_descale\[0\] is .*" + message):
            kvcache_on_device(q, call, make_options(0.0, None, True, (-1, -1), 0.0, False),
                              None, None, 0, False)
    assert torch.equal(k_cache.view(torch.uint8), before.view(torch.uint8))


def test_kvcache_route_choice_keeps_8bit_caches_off_flash_attn():
    call = _dispatch.CallFeatures(dtype="bfloat16", head_dim=128, head_dim_v=128, kv8=True)
    env = _dispatch.Environment(flash_attn_version="2.8.3", cuda_capability=(9, 0))
    choice = _dispatch.select_backend("cuda", call, env)
    assert choice.backend == _dispatch.SDPA and "8-bit" in choice.reason
