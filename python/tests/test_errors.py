"""Bad input: each error is a TypeError/ValueError/NotImplementedError whose message names the argument."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from anyattn import _core


def _qkv(dtype="float32", q_heads=4, k_heads=2, d=16):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 5, q_heads, d)).astype(dtype)
    k = rng.standard_normal((1, 6, k_heads, d)).astype(dtype)
    v = rng.standard_normal((1, 6, k_heads, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "mutate,kwargs,error,pattern",
    [
        (lambda q, k, v: (q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)), {},
         TypeError, r"^q: numpy dtype float64 is not supported"),
        (lambda q, k, v: (q, k.astype(np.float16), v), {}, TypeError, r"^k: dtype float16 differs"),
        (lambda q, k, v: (q[0], k, v), {}, ValueError, r"^q: expected 4 dimensions"),
        (lambda q, k, v: (q, k[:, :, :1].repeat(3, axis=2), v[:, :, :1].repeat(3, axis=2)), {},
         ValueError, r"^k: nheads_k must divide"),
        (lambda q, k, v: (q, k, v[:, :4]), {}, ValueError, r"^v: seqlen_k and nheads_k"),
        (lambda q, k, v: (q, k[..., :8], v), {}, ValueError, r"^k: head dimension must match"),
        (lambda q, k, v: (np.zeros((1, 2, 2, 577), np.float32),) * 3, {}, ValueError, r"^q: head dimension"),
        (lambda q, k, v: (q, list(k), v), {}, TypeError, r"^k: expected a numpy.ndarray"),
        (lambda q, k, v: ("q", k, v), {}, TypeError, r"^q: expected a torch.Tensor or numpy.ndarray"),
        (lambda q, k, v: (q, k, v), {"window_size": (-2, 0)}, ValueError, r"^window_size"),
        (lambda q, k, v: (q, k, v), {"window_size": 3}, TypeError, r"^window_size"),
        (lambda q, k, v: (q, k, v), {"softcap": -1.0}, ValueError, r"^softcap"),
        (lambda q, k, v: (q, k, v), {"softmax_scale": float("nan")}, ValueError, r"^softmax_scale"),
        (lambda q, k, v: (q, k, v), {"alibi_slopes": np.ones(3, np.float32)}, ValueError, r"^alibi_slopes: expected shape \(4,\)"),
        (lambda q, k, v: (q, k, v), {"sinks": np.ones((1, 4), np.float32)}, ValueError, r"^sinks: expected shape \(4,\)"),
        (lambda q, k, v: (q, k, v), {"dropout_p": 0.1}, NotImplementedError, r"dropout_p > 0 .*numpy inputs.*torch tensors"),
        (lambda q, k, v: (q, k, v), {"dropout_p": 1.5}, ValueError, r"^dropout_p"),
    ],
)
def test_bad_input_names_the_argument(mutate, kwargs, error, pattern):
    q, k, v = mutate(*_qkv())
    with pytest.raises(error, match=pattern):
        anyattn.flash_attn_func(q, k, v, **kwargs)


def test_packed_shape_errors():
    with pytest.raises(ValueError, match=r"^qkv: expected shape \(batch, seqlen, 3"):
        anyattn.flash_attn_qkvpacked_func(np.zeros((1, 2, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"^kv: expected shape"):
        anyattn.flash_attn_kvpacked_func(np.zeros((1, 2, 2, 8), np.float32), np.zeros((1, 2, 3, 2, 8), np.float32))


def test_c_abi_errors_surface_with_the_library_message():
    # A spec with a non-unit last stride never comes from the package (it copies first); sent
    # straight to the extension it shows how C ABI errors reach Python: ValueError naming q.
    q = np.zeros((1, 2, 2, 16), np.float32)
    bad = (q.ctypes.data, _core.DTYPE_F32, (1, 2, 2, 8), (64, 32, 16, 2))
    out = np.zeros((1, 2, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"\bq\b"):
        _core.fwd(bad, q, q, out, None,
                  (0.0, 0.0, False, -1, -1, None, None, 0, 0.0, 0, 0, False))
    with pytest.raises(ValueError, match="isa"):
        _core.isa_code("sse9")


def test_torch_errors_name_the_argument():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 3, 2, 8)
    with pytest.raises(TypeError, match=r"^q: dtype torch.float64"):
        anyattn.flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match=r"^k: expected a torch.Tensor like q"):
        anyattn.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(ValueError, match=r"^k: is on meta, but q is on cpu"):
        anyattn.flash_attn_func(q, q.to("meta"), q)
    with pytest.raises(ValueError, match=r"^sinks: is on meta"):
        anyattn.flash_attn_func(q, q, q, sinks=torch.zeros(2, device="meta"))
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a floating-point"):
        anyattn.flash_attn_func(q, q, q, alibi_slopes=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^dropout_p: must be in \[0, 1\)"):
        anyattn.flash_attn_func(q, q, q, dropout_p=1.0)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("wrong", ["cache", "new"])
def test_kvcache_float_dtypes_must_match_q(requires_grad, wrong):
    # A float cache (or new keys) of another dtype than q is rejected by the library, never read
    # as q's dtype; the cache is left untouched.
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 1, 2, 8, requires_grad=requires_grad)
    cache_dtype = torch.float16 if wrong == "cache" else torch.float32
    k_cache = torch.randn(1, 16, 2, 8).to(cache_dtype)
    v_cache = torch.randn(1, 16, 2, 8).to(cache_dtype)
    before = k_cache.clone()
    k_new = torch.randn(1, 1, 2, 8).to(torch.float16 if wrong == "new" else torch.float32)
    seqlens = torch.tensor([3], dtype=torch.int32)
    name = "k_cache" if wrong == "cache" else r"cache->k_new"
    with pytest.raises(ValueError, match=rf"{name}\.dtype is f16 but q\.dtype is f32"):
        anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=k_new.clone(),
                                        cache_seqlens=seqlens)
    assert torch.equal(k_cache, before)


def test_paged_varlen_cache_dtype_must_match_q():
    torch = pytest.importorskip("torch")
    q = torch.randn(4, 2, 8)
    pages = torch.randn(2, 16, 2, 8).half()
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"k_cache\.dtype is f16 but q\.dtype is f32"):
        anyattn.flash_attn_varlen_func(q, pages, pages.clone(), cu, cu, 4, 4, causal=True,
                                       seqused_k=torch.tensor([4], dtype=torch.int32),
                                       block_table=torch.tensor([[0, 1]], dtype=torch.int32))
