"""The fast path of plain CPU torch calls (python/src/torch_plain_call.cc): flash_attn_func hands
its arguments to ``_core.fwd_torch_plain``, which runs the call or declines with None. A call it
runs must give bitwise the result of the ordinary path (same kernel, same parameters); any call
that needs more (autograd, dropout, per-head tensors, odd types or layouts, bad input) must be
declined, untouched, so that the ordinary path handles it and raises its own errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _core  # noqa: E402
from anyattn import flash_attn_interface  # noqa: E402


def _ordinary_path_ran(*args, **kwargs):
    """Patched over a function of the ordinary path: a call that reaches it fails the test."""
    raise AssertionError("the ordinary path ran")


def _qkv(b=2, sq=3, sk=9, hq=4, hk=2, d=32, dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, dv or d, generator=g).to(dtype)
    return q, k, v


def _plain(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
           softcap=0.0, alibi_slopes=None, return_attn_probs=False, sinks=None):
    return _core.fwd_torch_plain(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                 alibi_slopes, return_attn_probs, sinks)


def _ordinary(q, k, v, **kwargs):
    """The ordinary path's result: inputs that require grad make flash_attn_func go through the
    anyattn::fwd op, never the fast path."""
    args = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = anyattn.flash_attn_func(*args, **kwargs)
    return tuple(x.detach() for x in out) if isinstance(out, tuple) else out.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True},
    {"softmax_scale": 0.3, "softcap": 5.0},
    {"window_size": (2, 1)},
    {"window_size": [3, -1], "causal": True},
    {"softmax_scale": 2},
    {"softmax_scale": np.float64(0.125), "softcap": np.float64(3.0)},
])
def test_runs_plain_calls_bitwise_like_the_ordinary_path(dtype, kwargs):
    q, k, v = _qkv(dtype=dtype, dv=16)
    out = _plain(q, k, v, **kwargs)
    assert out is not None
    assert out.dtype == dtype and out.shape == (2, 3, 4, 16) and out.is_contiguous()
    assert torch.equal(out, _ordinary(q, k, v, **kwargs))


@pytest.mark.parametrize("kwargs", [
    {"alibi_slopes": torch.rand(4), "causal": True},
    {"alibi_slopes": torch.rand(2, 4)},
    {"sinks": torch.linspace(-1.0, 2.0, 4), "window_size": (2, 0)},
    {"return_attn_probs": True, "sinks": torch.linspace(-1.0, 2.0, 4), "causal": True},
], ids=["alibi", "alibi 2-D", "sinks", "lse"])
def test_runs_calls_with_per_head_tensors_and_the_lse_bitwise_like_the_ordinary_path(kwargs):
    q, k, v = _qkv(dtype=torch.bfloat16, dv=16)
    result = _plain(q, k, v, **kwargs)
    want = _ordinary(q, k, v, **kwargs)
    assert result is not None
    if kwargs.get("return_attn_probs"):
        out, lse = result
        assert lse.shape == (2, 4, 3) and lse.dtype == torch.float32
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    else:
        assert torch.equal(result, want)


def test_reads_strided_views_in_place():
    q, k, v = _qkv(sq=5, sk=5, hq=2, hk=2)
    qkv = torch.stack([q, k, v], dim=2)  # (B, S, 3, H, D): each view strided in dims 0-2
    views = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = _plain(*views, causal=True)
    assert out is not None
    assert torch.equal(out, _ordinary(q, k, v, causal=True))


def test_runs_under_no_grad_and_inference_mode_even_for_leaf_tensors_that_require_grad():
    q, k, v = (x.requires_grad_() for x in _qkv())
    expected = _ordinary(q, k, v)
    with torch.no_grad():
        assert torch.equal(_plain(q, k, v), expected)
    with torch.inference_mode():
        assert torch.equal(_plain(*_qkv()), expected)


def _declined_cases():
    q, k, v = _qkv()
    yield "q requires grad", (q.clone().requires_grad_(), k, v), {}
    yield "v requires grad", (q, k, v.clone().requires_grad_()), {}
    yield "dropout", (q, k, v), {"dropout_p": 0.1}
    yield "float16 alibi", (q, k, v), {"alibi_slopes": torch.rand(4).half()}
    yield "bfloat16 sinks", (q, k, v), {"sinks": torch.randn(4).bfloat16()}
    yield "sinks that require grad", (q, k, v), {"sinks": torch.randn(4, requires_grad=True)}
    yield "sinks of the wrong length", (q, k, v), {"sinks": torch.randn(5)}
    yield "return_attn_probs an int", (q, k, v), {"return_attn_probs": 1}
    yield "explicit scale 0", (q, k, v), {"softmax_scale": 0.0}
    yield "scale nan", (q, k, v), {"softmax_scale": float("nan")}
    yield "scale a bool", (q, k, v), {"softmax_scale": True}
    yield "scale a tensor", (q, k, v), {"softmax_scale": torch.tensor(0.5)}
    yield "scale a numpy float64 inf", (q, k, v), {"softmax_scale": np.float64("inf")}
    yield "causal an int", (q, k, v), {"causal": 1}
    yield "window below -1", (q, k, v), {"window_size": (-2, 0)}
    yield "window of three", (q, k, v), {"window_size": (1, 1, 1)}
    yield "window of None", (q, k, v), {"window_size": (None, None)}
    yield "negative softcap", (q, k, v), {"softcap": -1.0}
    yield "a Parameter", (torch.nn.Parameter(q, requires_grad=False), k, v), {}
    yield "numpy", (q.numpy(), k.numpy(), v.numpy()), {}
    yield "strided last dim", (q.transpose(2, 3).contiguous().transpose(2, 3), k, v), {}
    yield "empty batch", _qkv(b=0)[:3], {}
    yield "mixed dtypes", (q, k.half(), v), {}
    yield "float64", (q.double(), k.double(), v.double()), {}
    yield "3-D q", (q[0], k, v), {}
    yield "head dim the library rejects", _qkv(d=577), {}
    yield "heads that do not divide", _qkv(hq=3, hk=2), {}
    yield "batch mismatch", (q[:1], k, v), {}


@pytest.mark.parametrize("name,tensors,kwargs", list(_declined_cases()),
                         ids=[c[0] for c in _declined_cases()])
def test_declines_calls_that_are_not_plain(name, tensors, kwargs):
    assert _plain(*tensors, **kwargs) is None


def test_flash_attn_func_takes_the_fast_path_for_plain_calls(monkeypatch):

    q, k, v = _qkv(sq=1, sk=16, hq=8, hk=8, d=64)
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 8).bfloat16(), requires_grad=False)
    want = _ordinary(q, k, v, sinks=sinks, return_attn_probs=True)
    monkeypatch.setattr(flash_attn_interface, "make_options", _ordinary_path_ran)
    assert anyattn.flash_attn_func(q, k, v, causal=True).shape == (2, 1, 8, 64)
    out, lse, s_dmask = anyattn.flash_attn_func(q, k, v, sinks=sinks, return_attn_probs=True)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype


def test_declined_calls_still_raise_the_ordinary_errors():
    q, k, v = _qkv(d=577)
    with pytest.raises(ValueError, match=r"q: head dimension must be in \[0, 576\], got 577"):
        anyattn.flash_attn_func(q, k, v)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"window_size: entries must be >= -1"):
        anyattn.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(TypeError, match=r"q: expected a torch.Tensor or numpy.ndarray"):
        anyattn.flash_attn_func([1.0], k, v)


def test_declined_calls_give_the_ordinary_results():
    q, k, v = _qkv(sq=4, sk=4, hq=2, hk=2)
    out = anyattn.flash_attn_func(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, _ordinary(q, k, v, causal=True).numpy())
    empty = anyattn.flash_attn_func(*_qkv(b=0))
    assert empty.shape == (0, 3, 4, 32)


# flash_attn_with_kvcache

def _cache_call(dtype=torch.float32, b=2, hq=4, hk=2, d=32, capacity=12, new=1, paged=False,
                seed=1):
    """(q, k_cache, v_cache, k, v, cache_seqlens, block_table): keys already cached 5 and 9,
    ``new`` tokens to append (None for none); a paged cache has pages of 4 rows, shuffled."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    q = r(b, 1, hq, d)
    block_table = None
    if paged:
        pages = capacity // 4
        k_cache, v_cache = r(b * pages, 4, hk, d), r(b * pages, 4, hk, d)
        block_table = torch.randperm(b * pages, generator=g).to(torch.int32).reshape(b, pages)
    else:
        k_cache, v_cache = r(b, capacity, hk, d), r(b, capacity, hk, d)
    k = v = None
    if new:
        k, v = r(b, new, hk, d), r(b, new, hk, d)
    seqlens = torch.tensor([5, 9][:b], dtype=torch.int32)
    return q, k_cache, v_cache, k, v, seqlens, block_table


def _plain_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                   cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                   softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                   return_softmax_lse=False, sinks=None, k_descale=None, v_descale=None,
                   k_token_scale=None, v_token_scale=None):
    return _core.fwd_kvcache_torch_plain(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, sinks, k_descale,
        v_descale, k_token_scale, v_token_scale)


def _ordinary_kvcache(q, k_cache, v_cache, **kwargs):
    """The ordinary path's result and caches, on copies: a q that requires grad makes
    flash_attn_with_kvcache go through the anyattn::fwd_kvcache op, never the fast path."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = anyattn.flash_attn_with_kvcache(q.clone().requires_grad_(), k_cache, v_cache, **kwargs)
    if isinstance(out, tuple):
        return tuple(x.detach() for x in out), k_cache, v_cache
    return out.detach(), k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("new", [0, 2])
@pytest.mark.parametrize("kwargs", [{}, {"causal": True, "num_splits": 2},
                                    {"window_size": (3, 0), "softcap": 4.0, "softmax_scale": 0.2}])
def test_kvcache_runs_plain_calls_bitwise_like_the_ordinary_path(dtype, paged, new, kwargs):
    q, k_cache, v_cache, k, v, seqlens, block_table = _cache_call(dtype, new=new, paged=paged)
    call = dict(k=k, v=v, cache_seqlens=seqlens, block_table=block_table, **kwargs)
    expected, k_expected, v_expected = _ordinary_kvcache(q, k_cache, v_cache, **call)
    out = _plain_kvcache(q, k_cache, v_cache, **call)
    assert out is not None and out.dtype == dtype and out.shape == (2, 1, 4, 32)
    assert torch.equal(out, expected)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


@pytest.mark.parametrize("cache_seqlens", [None, 7])
def test_kvcache_takes_an_int_or_no_cache_seqlens(cache_seqlens):
    q, k_cache, v_cache, *_ = _cache_call(new=0)
    expected, _, _ = _ordinary_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens)
    assert torch.equal(_plain_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens), expected)


def _declined_kvcache_cases():
    q, k_cache, v_cache, k, v, seqlens, _ = _cache_call(new=1)
    base = dict(k=k, v=v, cache_seqlens=seqlens)
    rotary = torch.randn(16, 8)
    yield "rotary without new keys", dict(cache_seqlens=seqlens, rotary_cos=rotary,
                                          rotary_sin=rotary)
    yield "rotary_cos alone", dict(base, rotary_cos=rotary)
    yield "rotary_interleaved an int", dict(base, rotary_cos=rotary, rotary_sin=rotary,
                                            rotary_interleaved=1)
    yield "int64 cache_batch_idx", dict(base, cache_batch_idx=torch.tensor([1, 0]))
    yield "repeated cache_batch_idx", dict(base, cache_batch_idx=torch.tensor(
        [1, 1], dtype=torch.int32))
    yield "cache_leftpad past the keys", dict(base, cache_leftpad=torch.tensor(
        [0, 10], dtype=torch.int32))
    yield "float16 alibi", dict(base, alibi_slopes=torch.rand(4).half())
    yield "alibi that requires grad", dict(base, alibi_slopes=torch.rand(4, requires_grad=True))
    yield "bfloat16 sinks", dict(base, sinks=torch.randn(4).bfloat16())
    yield "sinks a Parameter", dict(base, sinks=torch.nn.Parameter(torch.randn(4)))
    yield "return_softmax_lse an int", dict(base, return_softmax_lse=1)
    yield "int64 cache_seqlens", dict(base, cache_seqlens=seqlens.long())
    yield "list cache_seqlens", dict(base, cache_seqlens=[5, 9])
    yield "negative cache_seqlens", dict(base, cache_seqlens=-1)
    yield "k without v", dict(base, v=None)
    yield "int64 block_table", dict(base, block_table=torch.zeros(2, 3, dtype=torch.int64))
    yield "num_splits a float", dict(base, num_splits=1.0)
    yield "num_splits a bool", dict(base, num_splits=True)
    yield "new keys require grad", dict(base, k=k.clone().requires_grad_())
    yield "appends past the capacity", dict(base, cache_seqlens=12)
    yield "explicit scale 0", dict(base, softmax_scale=0.0)


@pytest.mark.parametrize("name,kwargs", list(_declined_kvcache_cases()),
                         ids=[c[0] for c in _declined_kvcache_cases()])
def test_kvcache_declines_calls_that_are_not_plain_and_writes_nothing(name, kwargs):
    q, k_cache, v_cache, *_ = _cache_call(new=1)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    assert _plain_kvcache(q, k_cache, v_cache, **kwargs) is None
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


_KVCACHE_EXTRAS = {
    "rotary": {"rotary": True, "causal": True},
    "rotary neox alibi": {"rotary": True, "rotary_interleaved": False,
                          "alibi_slopes": torch.rand(4)},
    "alibi 2-D sinks": {"alibi_slopes": torch.rand(2, 4), "sinks": torch.linspace(-1.0, 2.0, 4)},
    "lse": {"return_softmax_lse": True, "sinks": torch.linspace(-1.0, 2.0, 4), "causal": True},
}
_CONTIGUOUS_EXTRAS = {  # cache_batch_idx and cache_leftpad address contiguous caches
    "cache_batch_idx": {"cache_batch_idx": torch.tensor([1, 0], dtype=torch.int32),
                        "causal": True},
    "cache_leftpad": {"cache_leftpad": torch.tensor([0, 2], dtype=torch.int32), "causal": True},
}
_EXTRA_CASES = ([(False, name) for name in {**_KVCACHE_EXTRAS, **_CONTIGUOUS_EXTRAS}]
                + [(True, name) for name in _KVCACHE_EXTRAS])


@pytest.mark.parametrize("paged,name", _EXTRA_CASES)
def test_kvcache_runs_calls_with_rotary_indices_and_per_head_tensors_like_the_ordinary_path(
        paged, name):
    kwargs = dict({**_KVCACHE_EXTRAS, **_CONTIGUOUS_EXTRAS}[name])
    q, k_cache, v_cache, k, v, seqlens, block_table = _cache_call(torch.bfloat16, new=2,
                                                                  paged=paged)
    if kwargs.pop("rotary", False):
        angles = torch.rand(24, 8) * 3
        kwargs.update(rotary_cos=angles.cos(), rotary_sin=angles.sin())
    call = dict(k=k, v=v, cache_seqlens=seqlens, block_table=block_table, **kwargs)
    expected, k_expected, v_expected = _ordinary_kvcache(q, k_cache, v_cache, **call)
    result = _plain_kvcache(q, k_cache, v_cache, **call)
    assert result is not None
    if kwargs.get("return_softmax_lse"):
        out, lse = result
        assert lse.dtype == torch.float32 and lse.shape == (2, 4, 1)
        assert torch.equal(lse, expected[1]) and torch.equal(out, expected[0])
    else:
        assert torch.equal(result, expected)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_flash_attn_with_kvcache_takes_the_fast_path_for_plain_calls(monkeypatch):
    from anyattn import kvcache


    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    q, k_cache, v_cache, k, v, seqlens, _ = _cache_call(new=1)
    out = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                          causal=True)
    assert out.shape == (2, 1, 4, 32)
    assert torch.equal(k_cache[0, 5], k[0, 0]) and torch.equal(v_cache[1, 9], v[1, 0])


def test_kvcache_declined_calls_still_raise_the_ordinary_errors():
    q, k_cache, v_cache, k, v, seqlens, _ = _cache_call(new=1)
    with pytest.raises(ValueError, match="cache_seqlens"):
        anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=12)
    with pytest.raises(ValueError, match="k, v: give both new keys and new values, or neither"):
        anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, None, cache_seqlens=seqlens)


@pytest.mark.parametrize("style", ["fa3", "fa4"])
def test_fa3_and_fa4_calls_without_the_lse_take_the_fast_path(monkeypatch, style):
    """FA3's and FA4's wrappers ask for the LSE only when they return it, so that a plain call
    reaches the fast path (the ordinary one costs several times the call at decode shapes)."""
    from anyattn import fa3_interface, fa4_interface, kvcache


    monkeypatch.setattr(flash_attn_interface, "make_options", _ordinary_path_ran)
    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    q, k, v = _qkv(sq=1, sk=16, hq=8, hk=8, d=64)
    if style == "fa3":
        assert fa3_interface.flash_attn_func(q, k, v, causal=True).shape == (2, 1, 8, 64)
        q1, k_cache, v_cache, k1, v1, seqlens, _ = _cache_call(new=1)
        out = fa3_interface.flash_attn_with_kvcache(q1, k_cache, v_cache, k1, v1,
                                                    cache_seqlens=seqlens, causal=True)
        assert out.shape == (2, 1, 4, 32) and torch.equal(k_cache[0, 5], k1[0, 0])
    else:
        out, lse = fa4_interface.flash_attn_func(q, k, v, causal=True)
        assert out.shape == (2, 1, 8, 64) and lse is None


# ---- flash_attn_varlen_func -------------------------------------------------------------------


def _packed(dtype=torch.float32, seed=0):
    """q (13, 4, 32), k (15, 2, 32), v (15, 2, 16): sequences of 3, 0 and 8 queries against 6, 2
    and 7 keys, whose rows start at 1 (row 0 and the last row belong to no sequence)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(13, 4, 32, generator=g).to(dtype)
    k = torch.randn(16, 2, 32, generator=g).to(dtype)
    v = torch.randn(16, 2, 16, generator=g).to(dtype)
    cu_q = torch.tensor([1, 4, 4, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 8, 15], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _varlen_plain(q, k, v, cu_q, cu_k, max_q=8, max_k=7, dropout_p=0.0, softmax_scale=None,
                  causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  return_attn_probs=False, sinks=None, seqused_k=None):
    return _core.fwd_varlen_torch_plain(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p,
                                        softmax_scale, causal, window_size, softcap, alibi_slopes,
                                        return_attn_probs, sinks, seqused_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True},
    {"softmax_scale": 0.3, "softcap": 5.0, "window_size": (2, 1)},
    {"seqused_k": torch.tensor([4, 2, 5], dtype=torch.int32), "causal": True},
])
def test_varlen_runs_plain_calls_bitwise_like_the_ordinary_path(dtype, kwargs):
    q, k, v, cu_q, cu_k = _packed(dtype)
    out = _varlen_plain(q, k, v, cu_q, cu_k, **kwargs)
    assert out is not None and out.shape == (13, 4, 16) and out.dtype == dtype
    args = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want = anyattn.flash_attn_varlen_func(*args, cu_q, cu_k, 8, 7, **kwargs).detach()
    assert torch.equal(out, want)
    assert not out[0].any() and not out[12].any()  # rows of no sequence are 0, as ordinarily


@pytest.mark.parametrize("kwargs", [
    {"alibi_slopes": torch.rand(3, 4), "causal": True},
    {"return_attn_probs": True, "sinks": torch.linspace(-1.0, 2.0, 4), "causal": True},
], ids=["alibi", "lse sinks"])
def test_varlen_runs_calls_with_per_head_tensors_and_the_lse_bitwise_like_the_ordinary_path(
        kwargs):
    q, k, v, cu_q, cu_k = _packed(torch.bfloat16)
    result = _varlen_plain(q, k, v, cu_q, cu_k, **kwargs)
    args = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want = anyattn.flash_attn_varlen_func(*args, cu_q, cu_k, 8, 7, **kwargs)
    assert result is not None
    if kwargs.get("return_attn_probs"):
        out, lse = result
        assert torch.equal(out, want[0].detach()) and torch.equal(lse, want[1])
        assert torch.isneginf(lse[:, 0]).all() and torch.isneginf(lse[:, 12]).all()
    else:
        assert torch.equal(result, want.detach())


def _varlen_declined_cases():
    q, k, v, cu_q, cu_k = _packed()
    yield "float16 alibi", (q, k, v, cu_q, cu_k), {"alibi_slopes": torch.ones(4).half()}
    yield "bfloat16 sinks", (q, k, v, cu_q, cu_k), {"sinks": torch.zeros(4).bfloat16()}
    yield "lse asked for by an int", (q, k, v, cu_q, cu_k), {"return_attn_probs": 1}
    yield "dropout", (q, k, v, cu_q, cu_k), {"dropout_p": 0.1}
    yield "scale 0", (q, k, v, cu_q, cu_k), {"softmax_scale": 0.0}
    yield "requires grad", (q.clone().requires_grad_(), k, v, cu_q, cu_k), {}
    yield "int64 offsets", (q, k, v, cu_q.long(), cu_k), {}
    yield "offsets a list", (q, k, v, [1, 4, 4, 12], cu_k), {}
    yield "max_seqlen a tensor", (q, k, v, cu_q, cu_k), {"max_q": torch.tensor(8)}
    yield "4-D q", (q[None], k, v, cu_q, cu_k), {}
    yield "mixed dtypes", (q, k.half(), v, cu_q, cu_k), {}
    yield "strided last dim", (q, k.transpose(1, 2).contiguous().transpose(1, 2), v, cu_q,
                               cu_k), {}


@pytest.mark.parametrize("name,tensors,kwargs", list(_varlen_declined_cases()),
                         ids=[c[0] for c in _varlen_declined_cases()])
def test_varlen_declines_calls_that_are_not_plain(name, tensors, kwargs):
    assert _varlen_plain(*tensors, **kwargs) is None


def test_varlen_takes_the_fast_path_for_plain_calls_and_errors_stay_the_ordinary_ones(
        monkeypatch):
    from anyattn import varlen

    q, k, v, cu_q, cu_k = _packed()
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        anyattn.flash_attn_varlen_func(q, k, v, torch.tensor([0, 20], dtype=torch.int32), cu_k,
                                       20, 7)


    monkeypatch.setattr(varlen, "make_options", _ordinary_path_ran)
    assert anyattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 8, 7, causal=True).shape == \
        (13, 4, 16)


# ---- Packed queries against a cache read in place ---------------------------------------------
# flash_attn_varlen_func with block_table and seqused_k (vLLM's call), FA3's flash_attn_with_kvcache
# with cu_seqlens_q (sglang's decode and extend steps) and FA4's flash_attn_varlen_func with
# page_table hand their calls to _core.fwd_kvcache_varlen_torch_plain.


def _cache_varlen(dtype=torch.float32, paged=True, seed=0):
    """q (13, 4, 32) packed as in _packed (sequences of 3, 0 and 8 queries from row 1); a cache of
    Hk 2, D 32, Dv 16: paged (12 pages of 4 positions, a shuffled (3, 4) table) or contiguous
    (3, 16, ...); the sequences hold 6, 2 and 13 keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(13, 4, 32, generator=g).to(dtype)
    shape = (12, 4) if paged else (3, 16)
    k_cache = torch.randn(*shape, 2, 32, generator=g).to(dtype)
    v_cache = torch.randn(*shape, 2, 16, generator=g).to(dtype)
    table = (torch.randperm(12, generator=g).reshape(3, 4).to(torch.int32) if paged
             else None)
    cu_q = torch.tensor([1, 4, 4, 12], dtype=torch.int32)
    used = torch.tensor([6, 2, 13], dtype=torch.int32)
    return q, k_cache, v_cache, table, cu_q, used


def _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, max_q=None, dropout_p=0.0,
                        softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, return_attn_probs=False, sinks=None, num_splits=0,
                        k_descale=None, v_descale=None, k_token_scale=None, v_token_scale=None):
    return _core.fwd_kvcache_varlen_torch_plain(
        q, k_cache, v_cache, cu_q, max_q, used, table, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, return_attn_probs, sinks, num_splits, k_descale,
        v_descale, k_token_scale, v_token_scale)


def _fa3_cache_call(q, k_cache, v_cache, table, cu_q, used, **kwargs):
    from anyattn import fa3_interface

    return fa3_interface.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used,
                                                 page_table=table, cu_seqlens_q=cu_q,
                                                 max_seqlen_q=8, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True, "num_splits": 2},
    {"softmax_scale": 0.3, "softcap": 5.0, "window_size": (2, 1)},
    {"causal": True, "sinks": torch.linspace(-1.0, 2.0, 4)},
])
def test_cache_varlen_runs_plain_calls_bitwise_like_the_ordinary_path(dtype, paged, kwargs):
    """Against FA3's planned route (a q that requires grad keeps its call off the fast path)."""
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(dtype, paged)
    out = _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, **kwargs)
    assert out is not None and out.shape == (13, 4, 16) and out.dtype == dtype
    want = _fa3_cache_call(q.clone().requires_grad_(), k_cache, v_cache, table, cu_q, used,
                           **kwargs).detach()
    assert torch.equal(out, want)
    assert not out[0].any() and not out[12].any()  # rows of no sequence are 0, as ordinarily


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_outputs_are_0_outside_every_sequence_on_reused_memory(dtype):
    """The packed calls allocate their output uninitialised and zero only the rows outside every
    sequence (the library writes the rest): each call here follows the release of a NaN-filled
    block of the output's size, which the allocator tends to hand out again."""
    q, k, v, cu_q, cu_k = _packed(dtype)
    qc, k_cache, v_cache, table, cu_qc, used = _cache_varlen(dtype)
    no_keys = torch.tensor([0, 6, 8, 8], dtype=torch.int32)  # the last sequence sees no key
    calls = [lambda: _varlen_plain(q, k, v, cu_q, cu_k),
             lambda: _varlen_plain(q, k, v, cu_q, no_keys),
             lambda: _cache_varlen_plain(qc, k_cache, v_cache, cu_qc, used, table),
             lambda: _cache_varlen_plain(qc, k_cache, v_cache, cu_qc,
                                         torch.tensor([6, 2, 0], dtype=torch.int32), table)]
    for call in calls:
        want = call()
        for _ in range(8):
            stale = torch.full_like(want, float("nan"))
            del stale
            out = call()
            assert not out[0].any() and not out[12].any()
            assert torch.equal(out, want)
    assert not want[4:12].any()  # the sequence without keys reads 0


@pytest.mark.parametrize("alibi_slopes", [torch.rand(4), torch.rand(3, 4)], ids=["1-D", "2-D"])
def test_paged_varlen_with_alibi_runs_bitwise_like_the_ordinary_path(alibi_slopes):
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    out = _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, max_q=8, causal=True,
                              alibi_slopes=alibi_slopes)
    assert out is not None
    want = anyattn.flash_attn_varlen_func(q.clone().requires_grad_(), k_cache, v_cache, cu_q,
                                          None, 8, 13, causal=True, seqused_k=used,
                                          block_table=table, alibi_slopes=alibi_slopes)
    assert torch.equal(out, want.detach())


def test_cache_varlen_checks_a_given_max_seqlen_q():
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen()
    assert _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, max_q=8) is not None
    assert _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, max_q=7) is None


def _cache_varlen_declined_cases():
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen()
    base = (q, k_cache, v_cache, cu_q, used, table)
    yield "float16 alibi", base, {"alibi_slopes": torch.ones(4, dtype=torch.float16)}
    yield "bfloat16 sinks", base, {"sinks": torch.zeros(4, dtype=torch.bfloat16)}
    yield "sinks that require grad", base, {"sinks": torch.zeros(4, requires_grad=True)}
    yield "sinks a Parameter", base, {"sinks": torch.nn.Parameter(torch.zeros(4))}
    yield "sinks of the wrong length", base, {"sinks": torch.zeros(5)}
    yield "lse asked for by an int", base, {"return_attn_probs": 1}
    yield "dropout", base, {"dropout_p": 0.1}
    yield "scale 0", base, {"softmax_scale": 0.0}
    yield "num_splits negative", base, {"num_splits": -1}
    yield "requires grad", (q.clone().requires_grad_(),) + base[1:], {}
    yield "int64 offsets", base[:3] + (cu_q.long(),) + base[4:], {}
    yield "decreasing offsets", base[:3] + (cu_q.flip(0),) + base[4:], {}
    yield "int64 key counts", base[:4] + (used.long(), table), {}
    yield "paged without key counts", base[:4] + (None, table), {}
    yield "keys past the table", base[:4] + (torch.tensor([6, 2, 17], dtype=torch.int32),
                                             table), {}
    yield "int64 table", base[:5] + (table.long(),), {}
    int8 = (q, k_cache.to(torch.int8), v_cache.to(torch.int8)) + base[3:]
    yield "float16 descale", int8, {"k_descale": torch.ones(2, dtype=torch.float16)}
    yield "0-d descale", int8, {"k_descale": torch.tensor(1.0)}
    yield "float descale", int8, {"k_descale": 0.5}
    yield "descale that requires grad", int8, {"k_descale": torch.ones(2, requires_grad=True)}
    yield "NaN descale", int8, {"k_descale": torch.tensor([1.0, float("nan")])}
    yield "descale of the wrong shape", int8, {"k_descale": torch.ones(3)}
    yield "token scale of the wrong shape", int8, {"k_token_scale": torch.ones(12, 4, 3),
                                                   "v_token_scale": torch.ones(12, 4, 3)}
    yield "scales for a float cache", base, {"k_descale": torch.ones(2)}
    yield "mixed 8-bit dtypes", (q, k_cache.to(torch.int8),
                                 v_cache.to(torch.float8_e4m3fn)) + base[3:], {}
    yield "mixed dtypes", (q, k_cache.half(), v_cache.half()) + base[3:], {}


@pytest.mark.parametrize("name,args,kwargs", list(_cache_varlen_declined_cases()),
                         ids=[c[0] for c in _cache_varlen_declined_cases()])
def test_cache_varlen_declines_calls_that_are_not_plain(name, args, kwargs):
    assert _cache_varlen_plain(*args, **kwargs) is None


def _no_planning(monkeypatch):
    """Makes the ordinary routes of the three cache calls fail if they run: every module that
    binds plan_subsequences (each imports it by name), and the paged varlen route."""
    from anyattn import _fa3_cache, _fa3_fp8, _fa_plan, varlen

    planner = _fa_plan.plan_subsequences
    for module in (_fa_plan, _fa3_cache, _fa3_fp8):
        assert module.plan_subsequences is planner
        monkeypatch.setattr(module, "plan_subsequences", _ordinary_path_ran)
    monkeypatch.setattr(varlen, "_paged_varlen", _ordinary_path_ran)


def _cache_calls():
    """(name, call(q, k_cache, v_cache, table, cu_q, used[, 8-bit scales]) -> out) of each
    public entry point."""
    from anyattn import fa4_interface

    yield "flash_attn_varlen_func", lambda q, kc, vc, table, cu_q, used, **scales: \
        anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, None, 8, 13, causal=True,
                                       seqused_k=used, block_table=table, **scales)
    yield "fa3 flash_attn_with_kvcache", lambda q, kc, vc, table, cu_q, used, **scales: \
        _fa3_cache_call(q, kc, vc, table, cu_q, used, causal=True, **scales)
    yield "fa4 flash_attn_varlen_func", lambda q, kc, vc, table, cu_q, used: \
        fa4_interface.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu_q, seqused_k=used,
                                             page_table=table, causal=True)[0]


@pytest.mark.parametrize("name,call", list(_cache_calls()), ids=[c[0] for c in _cache_calls()])
def test_cache_varlen_entry_points_take_the_fast_path(monkeypatch, name, call):
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        planned = call(q, k_cache, v_cache, table, cu_q, used)
    _no_planning(monkeypatch)
    out = call(q, k_cache, v_cache, table, cu_q, used)
    assert torch.equal(out, planned)


def test_fa3_cache_call_with_a_contiguous_cache_and_an_int_length_takes_the_fast_path(
        monkeypatch):
    q, k_cache, v_cache, _, cu_q, _ = _cache_varlen(paged=False)
    want = _fa3_cache_call(q.clone().requires_grad_(), k_cache, v_cache, None, cu_q, 9).detach()
    _no_planning(monkeypatch)
    assert torch.equal(_fa3_cache_call(q, k_cache, v_cache, None, cu_q, 9), want)


@pytest.mark.parametrize("name,call", list(_cache_calls()), ids=[c[0] for c in _cache_calls()])
def test_cache_varlen_declined_calls_still_raise_the_ordinary_errors(name, call):
    q, k_cache, v_cache, table, cu_q, _ = _cache_varlen()
    too_many = torch.tensor([6, 2, 17], dtype=torch.int32)
    with pytest.raises(ValueError, match="seqused_k|cache_seqlens"):
        call(q, k_cache, v_cache, table, cu_q, too_many)


def test_fa4_paged_call_with_batched_queries_takes_the_fast_path(monkeypatch):
    from anyattn import fa4_interface

    q, k_cache, v_cache, table, _, _ = _cache_varlen(torch.bfloat16)
    q = q[:12].reshape(3, 4, 4, 32)
    used = torch.tensor([6, 4, 13], dtype=torch.int32)

    def call():
        return fa4_interface.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=used,
                                                    page_table=table, causal=True)[0]

    with monkeypatch.context() as m:
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        planned = call()
    _no_planning(monkeypatch)
    out = call()
    assert out.shape == (3, 4, 4, 16) and torch.equal(out, planned)


@pytest.mark.parametrize("style", ["fa3", "fa4"])
def test_cache_calls_with_parameter_sinks_take_the_fast_path(monkeypatch, style):
    """gpt-oss keeps its sinks in a bfloat16 Parameter that requires no grad: the FA3/FA4 cache
    calls pass them on as float32."""
    from anyattn import fa4_interface

    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 4).to(torch.bfloat16),
                               requires_grad=False)

    def call():
        if style == "fa3":
            return _fa3_cache_call(q, k_cache, v_cache, table, cu_q, used, causal=True,
                                   sinks=sinks)
        return fa4_interface.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=cu_q,
                                                    seqused_k=used, page_table=table,
                                                    causal=True, learnable_sink=sinks)[0]

    with monkeypatch.context() as m:
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        planned = call()
    _no_planning(monkeypatch)
    out = call()
    assert torch.equal(out, planned)
    no_sinks = _fa3_cache_call(q, k_cache, v_cache, table, cu_q, used, causal=True)
    assert not torch.equal(out, no_sinks)  # the sinks were applied



# ---- 8-bit caches -----------------------------------------------------------------------------


def _quantized(cache, dtype, seed):
    """An 8-bit cache of the same shape (codes from the float values) and float32 descales per kv
    head and token scales per (position, kv head), all positive."""
    g = torch.Generator().manual_seed(seed)
    codes = (cache.float() * 20).round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 \
        else cache.float().to(dtype)
    descale = torch.rand(cache.shape[2], generator=g) + 0.5
    token = torch.rand(cache.shape[:3], generator=g) + 0.25
    return codes, descale, token


_KV8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]


def _bits(x):
    return x.view(torch.uint8) if x.element_size() == 1 else x


@pytest.mark.parametrize("cache_dtype", _KV8, ids=str)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("granularity", ["head", "sequence", "token"])
def test_kvcache_runs_8bit_calls_bitwise_like_the_ordinary_path(cache_dtype, paged,
                                                                 granularity):
    """The batched cache call with an append, quantized into the cache by the library."""
    q, k_cache, v_cache, k, v, seqlens, block_table = _cache_call(torch.bfloat16, new=2,
                                                                  paged=paged)
    k_cache, k_descale, k_token = _quantized(k_cache, cache_dtype, 1)
    v_cache, v_descale, v_token = _quantized(v_cache, cache_dtype, 2)
    scales = {"k_descale": k_descale, "v_descale": v_descale}
    if granularity == "sequence":
        scales = {"k_descale": k_descale.expand(2, -1).contiguous(), "v_descale": v_descale[:1]}
    elif granularity == "token":
        scales.update(k_token_scale=k_token, v_token_scale=v_token)
    call = dict(k=k, v=v, cache_seqlens=seqlens, block_table=block_table, causal=True)
    copies = {name: x.clone() for name, x in scales.items()}
    expected, k_expected, v_expected = _ordinary_kvcache(q, k_cache, v_cache, **call, **copies)
    out = _plain_kvcache(q, k_cache, v_cache, **call, **scales)
    assert out is not None and out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    assert torch.equal(_bits(k_cache), _bits(k_expected))
    assert torch.equal(_bits(v_cache), _bits(v_expected))
    for name in scales:
        assert torch.equal(scales[name], copies[name])  # token scales written alike


@pytest.mark.parametrize("cache_dtype", _KV8, ids=str)
def test_cache_varlen_runs_8bit_calls_bitwise_like_the_ordinary_path(cache_dtype):
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.float16)
    k_cache, k_descale, k_token = _quantized(k_cache, cache_dtype, 1)
    v_cache, v_descale, v_token = _quantized(v_cache, cache_dtype, 2)
    scales = dict(k_descale=k_descale, v_descale=v_descale[:1], k_token_scale=k_token,
                  v_token_scale=v_token)
    out = _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, causal=True, **scales)
    assert out is not None and out.dtype == torch.float16
    want = _fa3_cache_call(q.clone().requires_grad_(), k_cache, v_cache, table, cu_q, used,
                           causal=True, **scales).detach()
    assert torch.equal(out, want)


def test_8bit_cache_calls_take_the_fast_path(monkeypatch):
    from anyattn import kvcache

    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    k_cache, k_descale, k_token = _quantized(k_cache, torch.int8, 1)
    v_cache, v_descale, v_token = _quantized(v_cache, torch.int8, 2)
    scales = dict(k_descale=k_descale, v_descale=v_descale, k_token_scale=k_token,
                  v_token_scale=v_token)
    calls = [c for name, c in _cache_calls() if not name.startswith("fa4")]  # FA4: float8 q/k/v
    with monkeypatch.context() as m:  # the ordinary route's results
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        wants = [call(q, k_cache, v_cache, table, cu_q, used, **scales) for call in calls]
    q4, k4, v4, k_new, v_new, seqlens, _ = _cache_call(torch.bfloat16, new=1)
    k4, kd4, kt4 = _quantized(k4, torch.int8, 3)
    v4, vd4, vt4 = _quantized(v4, torch.int8, 4)
    batched = dict(k=k_new, v=v_new, cache_seqlens=seqlens, k_descale=kd4, v_descale=vd4,
                   k_token_scale=kt4, v_token_scale=vt4)
    want_batched, k_want, _ = _ordinary_kvcache(q4, k4, v4, **batched)
    versions = kt4._version, k4._version


    _no_planning(monkeypatch)
    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    for call, want in zip(calls, wants):
        assert torch.equal(call(q, k_cache, v_cache, table, cu_q, used, **scales), want)
    assert torch.equal(anyattn.flash_attn_with_kvcache(q4, k4, v4, **batched), want_batched)
    assert torch.equal(k4, k_want)
    assert kt4._version > versions[0] and k4._version > versions[1]  # the writes are recorded



@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.int8], ids=str)
@pytest.mark.parametrize("broadcast", ["tensor", "head"])
def test_8bit_calls_with_broadcast_descales_take_the_fast_path(monkeypatch, cache_dtype,
                                                               broadcast):
    """sglang's and vLLM's FA3 calls pass one scale expanded to (batch, nheads_k) (strides 0;
    or a per-head scale expanded over the batch, strides (0, 1)): read as they are, bitwise
    like the ordinary route, the FP8 call style (float8 q, q_descale) and appends included."""
    from anyattn import kvcache

    def expanded(values, batch):
        return values[:1].expand(batch, 2) if broadcast == "tensor" else values.expand(batch, 2)

    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    k_cache, k_descale, _ = _quantized(k_cache, cache_dtype, 1)
    v_cache, v_descale, _ = _quantized(v_cache, cache_dtype, 2)
    scales = dict(k_descale=expanded(k_descale, 3), v_descale=expanded(v_descale, 3))
    assert scales["k_descale"].stride() == ((0, 0) if broadcast == "tensor" else (0, 1))
    calls = [lambda: _fa3_cache_call(q, k_cache, v_cache, table, cu_q, used, causal=True,
                                     **scales)]
    if cache_dtype != torch.int8:  # FA3's FP8 call style
        q8 = q.to(cache_dtype)
        calls.append(lambda: _fa3_cache_call(q8, k_cache, v_cache, table, cu_q, used,
                                             q_descale=expanded(k_descale, 3), **scales))
    q4, k4, v4, k_new, v_new, seqlens, _ = _cache_call(torch.bfloat16, new=1)
    k4, kd4, _ = _quantized(k4, cache_dtype, 3)
    v4, vd4, _ = _quantized(v4, cache_dtype, 4)
    batched = dict(k=k_new, v=v_new, cache_seqlens=seqlens, k_descale=expanded(kd4, 2),
                   v_descale=expanded(vd4, 2))
    with monkeypatch.context() as m:  # the ordinary route's results
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        wants = [call() for call in calls]
    want_batched, k_want, v_want = _ordinary_kvcache(q4, k4, v4, **batched)
    _no_planning(monkeypatch)
    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    for call, want in zip(calls, wants):
        assert torch.equal(call(), want)
    assert torch.equal(anyattn.flash_attn_with_kvcache(q4, k4, v4, **batched), want_batched)
    assert torch.equal(_bits(k4), _bits(k_want)) and torch.equal(_bits(v4), _bits(v_want))


# ---- FA3's qv on a latent row ------------------------------------------------------------------


_QV_D, _QV_DV = 16, 32  # the rotary and latent widths of the row [v | k]


def _qv_call(cache_dtype, lse, separate, adjacent_query, batched=False, seed=0):
    """sglang's absorbed-MLA read: packed q (the rotary part) and qv (the latent part) of three
    sequences (2, 0 and 3 queries, 8 heads) against one latent kv head, paged (pages of 4), with
    k_cache and v_cache the two column ranges of one row [v | k], or (``separate``) two caches of
    their own; q and qv the column ranges of one tensor [qv | q] (``adjacent_query``) or two
    tensors; ``batched``: q (3, 2, 8, D) without cu_seqlens_q instead. Returns call() -> out
    (with ``lse``, (out, lse))."""
    from anyattn import fa3_interface, kv_quant

    g = torch.Generator().manual_seed(seed)
    d, dv = _QV_D, _QV_DV
    row = torch.randn(10, 4, 1, dv + d, generator=g).to(torch.bfloat16)
    scales = {}
    if cache_dtype in _KV8:
        granularity = "token" if cache_dtype == torch.int8 else "tensor"
        row, descale, tokens = kv_quant.quantize_kv_cache(row, cache_dtype, granularity)
        scales = {"k_descale": descale, "v_descale": None if descale is None else
                  descale.clone(), "k_token_scale": tokens, "v_token_scale": tokens}
    elif cache_dtype is not None:
        row = row.to(cache_dtype)
    dtype = torch.bfloat16 if row.element_size() == 1 else row.dtype
    k_cache, v_cache = row[..., dv:], row[..., :dv]
    if separate:
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
    q_all = torch.randn(*((3, 2) if batched else (5,)), 8, dv + d, generator=g).to(dtype)
    qv, q = q_all[..., :dv], q_all[..., dv:]  # views of one tensor, as sglang slices them
    if not adjacent_query:
        qv, q = qv.clone(), q.clone()
    table = torch.randperm(10, generator=g)[:9].reshape(3, 3).to(torch.int32)
    seqlens = torch.tensor([7, 3, 12], dtype=torch.int32)
    packed = {} if batched else {"cu_seqlens_q": torch.tensor([0, 2, 2, 5], dtype=torch.int32),
                                 "max_seqlen_q": 3}

    def call():
        result = fa3_interface.flash_attn_with_kvcache(
            q, k_cache, v_cache, qv=qv, cache_seqlens=seqlens, page_table=table, causal=True,
            return_softmax_lse=lse, **packed, **scales)
        return result[:2] if lse else (result,)

    return call


@pytest.mark.parametrize("lse", [False, True])
@pytest.mark.parametrize("cache_dtype,separate,adjacent_query,batched", [
    (torch.bfloat16, False, True, False), (torch.bfloat16, False, False, False),
    (torch.float32, False, True, False), (torch.float8_e4m3fn, False, True, False),
    (torch.int8, False, True, False), (torch.bfloat16, True, True, False),
    (torch.bfloat16, False, True, True), (torch.int8, False, True, True)], ids=str)
def test_fa3_qv_read_takes_the_fast_path_bitwise_like_the_ordinary_route(
        monkeypatch, cache_dtype, separate, adjacent_query, batched, lse):
    """The qv call reads the row in one C function, with the results of the planned route:
    with q and qv sliced from one query as it stands (the call builds no CachePlan), otherwise
    with the query [qv | q] (or a gathered [k | v] copy of separate caches) made first."""
    from anyattn import fa3_interface, kvcache

    call = _qv_call(cache_dtype, lse, separate, adjacent_query, batched)
    with monkeypatch.context() as m:
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        want = call()
    _no_planning(monkeypatch)
    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    if adjacent_query and not separate:
        monkeypatch.setattr(fa3_interface, "CachePlan", _ordinary_path_ran)
    got = call()
    assert got[0].shape == ((3, 2) if batched else (5,)) + (8, _QV_DV)
    for got_x, want_x in zip(got, want):
        assert torch.equal(got_x, want_x)


# ---- The LSE ------------------------------------------------------------------------------------


@pytest.mark.parametrize("paged", [True, False])
def test_cache_varlen_returns_the_lse_bitwise_like_the_ordinary_path(paged):
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16, paged)
    result = _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, causal=True,
                                 return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 2
    out, lse = result
    assert lse.dtype == torch.float32 and lse.shape == (4, 13) and lse.is_contiguous()
    want = _fa3_cache_call(q.clone().requires_grad_(), k_cache, v_cache, table, cu_q, used,
                           causal=True, return_softmax_lse=True)
    assert torch.equal(out, want[0].detach()) and torch.equal(lse, want[1])
    assert torch.isneginf(lse[:, 0]).all() and torch.isneginf(lse[:, 12]).all()
    assert torch.isfinite(lse[:, 1:12]).all()


def _lse_calls():
    """(name, call(q, k_cache, v_cache, table, cu_q, used) -> (out, lse)) of the entry points
    that return the LSE of a packed-query cache call."""
    from anyattn import fa4_interface

    def fa2(q, kc, vc, table, cu_q, used):
        out, lse, s_dmask = anyattn.flash_attn_varlen_func(
            q, kc, vc, cu_q, None, 8, 13, causal=True, seqused_k=used, block_table=table,
            return_attn_probs=True)
        return out, lse

    def fa3(q, kc, vc, table, cu_q, used):
        out, lse, *accumulators = _fa3_cache_call(q, kc, vc, table, cu_q, used, causal=True,
                                                  return_softmax_lse=True)
        return out, lse

    def fa4(q, kc, vc, table, cu_q, used):
        return fa4_interface.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu_q, seqused_k=used,
                                                    page_table=table, causal=True,
                                                    return_lse=True)

    def fa4_batched(q, kc, vc, table, cu_q, used):
        return fa4_interface.flash_attn_varlen_func(q[:12].reshape(3, 4, 4, 32), kc, vc,
                                                    seqused_k=used, page_table=table,
                                                    causal=True, return_lse=True)

    return [("fa2", fa2), ("fa3", fa3), ("fa4", fa4), ("fa4 batched", fa4_batched)]


@pytest.mark.parametrize("name,call", _lse_calls(), ids=[c[0] for c in _lse_calls()])
def test_cache_calls_that_return_the_lse_take_the_fast_path(monkeypatch, name, call):
    q, k_cache, v_cache, table, cu_q, used = _cache_varlen(torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(_core, "fwd_kvcache_varlen_torch_plain", lambda *args: None)
        planned = call(q, k_cache, v_cache, table, cu_q, used)
    _no_planning(monkeypatch)
    out, lse = call(q, k_cache, v_cache, table, cu_q, used)
    assert torch.equal(out, planned[0])
    assert lse.shape == planned[1].shape and torch.equal(lse, planned[1])


def test_flash_attn_with_kvcache_with_rotary_sinks_and_the_lse_takes_the_fast_path(monkeypatch):
    """flash-attn's own decode call (rotary tables, new keys) and gpt-oss's (sinks in a bfloat16
    Parameter), through flash_attn_with_kvcache and FA3's batched call."""
    from anyattn import fa3_interface, kvcache

    q, k_cache, v_cache, k, v, seqlens, _ = _cache_call(torch.bfloat16, new=1)
    angles = torch.rand(16, 8) * 3
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 4).to(torch.bfloat16),
                               requires_grad=False)
    call = dict(cache_seqlens=seqlens, rotary_cos=angles.cos(), rotary_sin=angles.sin(),
                causal=True)
    want, k_want, v_want = _ordinary_kvcache(q, k_cache, v_cache, k=k, v=v,
                                             return_softmax_lse=True, sinks=sinks, **call)
    want_fa3 = fa3_interface.flash_attn_with_kvcache(
        q.clone().requires_grad_(), k_cache.clone(), v_cache.clone(), k, v, sinks=sinks,
        **call).detach()


    monkeypatch.setattr(kvcache, "make_options", _ordinary_path_ran)
    fa3_k, fa3_v = k_cache.clone(), v_cache.clone()
    out, lse = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                               return_softmax_lse=True, sinks=sinks, **call)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    assert torch.equal(fa3_interface.flash_attn_with_kvcache(q, fa3_k, fa3_v, k, v, sinks=sinks,
                                                             **call), want_fa3)


# ---- Random calls against the ordinary route ---------------------------------------------------


def _random_cache_case(seed):
    """A random packed-query cache call: dtype, GQA, lengths (some empty), rows outside every
    sequence, paged or contiguous, a float or 8-bit cache, and random options."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    dtype = pick([torch.float32, torch.float16, torch.bfloat16])
    hk = pick([1, 2])
    hq = hk * pick([1, 3, 4])
    d, dv = pick([(32, 32), (64, 16), (40, 40)])
    batch = pick([1, 2, 3])
    q_lens = torch.randint(0, 5, (batch,), generator=g)
    k_lens = q_lens + torch.randint(0, 20, (batch,), generator=g)
    lead = pick([0, 2])
    cu_q = torch.cat([torch.tensor([lead]), lead + q_lens.cumsum(0)]).to(torch.int32)
    total = int(cu_q[-1]) + pick([0, 1])
    if total == 0:
        total = 1
    page = pick([None, 1, 4, 16])
    if page is None:
        shape, table = (batch, 32), None
    else:
        blocks = (32 + page - 1) // page
        shape = (batch * blocks, page)
        table = torch.randperm(batch * blocks, generator=g).to(torch.int32).reshape(batch, blocks)
    q = torch.randn(total, hq, d, generator=g).to(dtype)
    k_cache = torch.randn(*shape, hk, d, generator=g)
    v_cache = torch.randn(*shape, hk, dv, generator=g)
    kv8 = pick([None, torch.int8, torch.float8_e4m3fn])
    scales = {}
    if kv8 is None:
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    else:
        k_cache, k_descale, k_token = _quantized(k_cache, kv8, seed + 1)
        v_cache, v_descale, v_token = _quantized(v_cache, kv8, seed + 2)
        scales = dict(k_descale=k_descale, v_descale=v_descale)
        if kv8 == torch.int8:
            scales.update(k_token_scale=k_token, v_token_scale=v_token)
    options = dict(causal=pick([False, True]), softcap=pick([0.0, 3.0]),
                   window_size=pick([(-1, -1), (3, 0), (2, 5)]))
    if pick([False, True]):
        options["sinks"] = torch.randn(hq, generator=g)
    if pick([False, True]):
        options["alibi_slopes"] = torch.rand(hq, generator=g)
    lse = pick([False, True])
    return q, k_cache, v_cache, table, cu_q, k_lens.to(torch.int32), scales, options, lse


@pytest.mark.parametrize("seed", range(40))
def test_random_paged_varlen_calls_match_the_ordinary_route(seed):
    q, k_cache, v_cache, table, cu_q, used, scales, options, lse = _random_cache_case(seed)
    max_q = max(int((cu_q[1:] - cu_q[:-1]).max()), 1)

    def call(query):
        return anyattn.flash_attn_varlen_func(
            query, k_cache, v_cache, cu_q, None, max_q, 32, seqused_k=used, block_table=table,
            return_attn_probs=lse, **scales, **options)

    if table is None:  # flash_attn_varlen_func reads paged caches only: FA3's call instead
        options.pop("alibi_slopes", None)

        def call(query):  # noqa: F811
            return _fa3_cache_call(query, k_cache, v_cache, None, cu_q, used,
                                   return_softmax_lse=lse, **scales, **options)

    plain = _cache_varlen_plain(q, k_cache, v_cache, cu_q, used, table, max_q=max_q,
                                return_attn_probs=lse, **scales, **options)
    assert plain is not None  # every random call is plain
    want = call(q.clone().requires_grad_())
    got = call(q)
    for got_x, want_x in zip(got if lse else (got,), want if lse else (want,)):
        if isinstance(want_x, torch.Tensor) and want_x.numel():
            assert torch.equal(got_x, want_x.detach())


def _random_append_case(seed):
    """A random flash_attn_with_kvcache call that appends: dtype, GQA, new tokens, rotary,
    cache_batch_idx or cache_leftpad (contiguous caches), paging, a float or 8-bit cache, and
    random options."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    dtype = pick([torch.float32, torch.float16, torch.bfloat16])
    hk = pick([1, 2])
    hq, d = hk * pick([1, 4]), pick([32, 64])
    batch, sq, new = pick([1, 2, 3]), pick([1, 2]), pick([1, 3])
    stored = torch.randint(0, 12, (batch,), generator=g).to(torch.int32)
    page = pick([None, 4])
    kwargs = dict(cache_seqlens=stored, causal=pick([False, True]),
                  window_size=pick([(-1, -1), (4, 0)]), softcap=pick([0.0, 2.0]),
                  return_softmax_lse=pick([False, True]))
    if page is None:
        shape = (batch, 16)
        if pick([False, True]):
            kwargs["cache_batch_idx"] = torch.randperm(batch, generator=g).to(torch.int32)
        elif pick([False, True]):
            kwargs["cache_leftpad"] = torch.minimum(stored, torch.full((batch,), 2,
                                                                       dtype=torch.int32))
    else:
        shape = (batch * 4, page)
        kwargs["block_table"] = torch.randperm(batch * 4, generator=g).to(
            torch.int32).reshape(batch, 4)
    q = torch.randn(batch, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(batch, new, hk, d, generator=g).to(dtype)
    v = torch.randn(batch, new, hk, d, generator=g).to(dtype)
    k_cache = torch.randn(*shape, hk, d, generator=g)
    v_cache = torch.randn(*shape, hk, d, generator=g)
    kv8 = pick([None, torch.int8, torch.float8_e5m2])
    if kv8 is None:
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    else:
        k_cache, k_descale, k_token = _quantized(k_cache, kv8, seed + 1)
        v_cache, v_descale, v_token = _quantized(v_cache, kv8, seed + 2)
        kwargs.update(k_descale=k_descale, v_descale=v_descale)
        if pick([False, True]):
            kwargs.update(k_token_scale=k_token, v_token_scale=v_token)
    if pick([False, True]):
        angles = torch.rand(32, d // 4, generator=g) * 3
        kwargs.update(rotary_cos=angles.cos(), rotary_sin=angles.sin(),
                      rotary_interleaved=pick([False, True]))
    if pick([False, True]):
        kwargs["sinks"] = torch.randn(hq, generator=g)
    return q, k, v, k_cache, v_cache, kwargs


@pytest.mark.parametrize("seed", range(40))
def test_random_appending_cache_calls_match_the_ordinary_route(seed):
    q, k, v, k_cache, v_cache, kwargs = _random_append_case(seed)
    tokens = {name: kwargs[name].clone() for name in ("k_token_scale", "v_token_scale")
              if name in kwargs}
    plain_kwargs = dict(kwargs, **tokens)
    plain_k, plain_v = k_cache.clone(), v_cache.clone()
    result = _plain_kvcache(q, plain_k, plain_v, k=k, v=v, **plain_kwargs)
    assert result is not None  # every random call is plain
    want, k_want, v_want = _ordinary_kvcache(q, k_cache, v_cache, k=k, v=v, **kwargs)
    for got_x, want_x in zip(result if kwargs["return_softmax_lse"] else (result,),
                             want if kwargs["return_softmax_lse"] else (want,)):
        assert torch.equal(got_x, want_x)
    assert torch.equal(_bits(plain_k), _bits(k_want))
    assert torch.equal(_bits(plain_v), _bits(v_want))
    for name, x in tokens.items():
        assert torch.equal(plain_kwargs[name], kwargs[name])
