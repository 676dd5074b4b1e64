"""Drop-in replacement for flash-attn 2.x's ``flash_attn_with_kvcache``: attention of new queries
against a contiguous or paged KV cache, with the optional in-place append of new keys and values.

numpy arrays and CPU torch tensors run anyattn's C kernel (through the ``anyattn::fwd_kvcache``
torch op for torch); torch tensors on other devices take the KV-cache device route
(_kvcache_route.py). docs/varlen_kvcache.md has the semantics.
"""

from __future__ import annotations

from typing import Optional, Tuple

from . import _core
from ._arguments import _check_rank, _f32, _f32_on, _index_tensor, _kind, _on_cpu
from ._cache import kvcache_forward
from ._kernel_options import kernel_options, kernel_query
from ._kv_scales import cache_scales, reject_q_descale
from ._options import make_options
from ._plain_call import float32_per_head, tracing
from ._tensors import torch_module

if torch_module() is not None:
    from . import _cache_ops
    from ._kvcache_route import CacheCall, kvcache_on_device


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
    alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False, sinks=None,
    q_descale=None, k_descale=None, v_descale=None, k_token_scale=None, v_token_scale=None,
):
    """Attention of q against a KV cache, with optional in-place append; flash-attn 2.x compatible.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or paged
            (num_blocks, page_size, nheads_k, headdim[_v]) with block_table; any page_size >= 1.
        k, v: optional (batch, seqlen_new, nheads_k, headdim[_v]) written into the caches in place
            at cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attention.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2): rotary embedding of q and the
            new k at their absolute positions (q at cache_seqlens[b] + i when causal or windowed,
            else at cache_seqlens[b]); rotary_interleaved selects GPT-J (True) or GPT-NeoX pairs.
        cache_seqlens: int, or (batch,) int32: keys already in the cache. None = the whole cache.
        cache_batch_idx: optional (batch,) int32: the cache batch each sequence reads (contiguous).
        cache_leftpad: optional (batch,) int32: each sequence's keys start at this cache position.
        block_table: optional (batch, max_blocks) int32 for a paged cache.
        softmax_scale, causal, window_size, softcap, alibi_slopes, sinks: as in flash_attn_func,
            with the mask bottom-right aligned to cache_seqlens[b] + seqlen_new - cache_leftpad[b].
        num_splits: key-dimension splits; 0 chooses automatically (never from the thread count).
        return_softmax_lse: also return the LSE (batch, nheads, seqlen_q) float32.
        k_descale, v_descale, k_token_scale, v_token_scale (torch tensors; token scales on the
            caches' device): the scales of an 8-bit cache (k_cache/v_cache of one dtype:
            torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8), whose elements read as
            stored * descale * token_scale. descale: float32 (1,), (nheads_k,) or (batch,
            nheads_k) (FlashAttention 3's names and layout), or a float; None = 1. token_scale:
            float32 (batch_cache, seqlen_cache, nheads_k) or paged (num_blocks, page_size,
            nheads_k), both or neither; the append writes the new positions' scales. New k/v are
            quantized as described in anyattn.kv_quant (round to nearest even, saturate);
            quantize_kv_cache makes such a cache from a float one. Off the CPU the cache is read
            dequantized to q's dtype (docs/python.md, "Device dispatch").
        q_descale: accepted as None only (q stays float32/float16/bfloat16).
    Returns:
        out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with return_softmax_lse.
    """
    reject_q_descale(q_descale)
    scaled = not (k_descale is None and v_descale is None and k_token_scale is None
                  and v_token_scale is None)
    # A plain CPU torch call runs in one C function (_plain_call.py), 8-bit caches too.
    if not tracing():
        out = _core.fwd_kvcache_torch_plain(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, float32_per_head(alibi_slopes), num_splits, return_softmax_lse,
            float32_per_head(sinks), k_descale, v_descale, k_token_scale, v_token_scale)
        if out is not None:
            if k is not None:
                _mark_written(k_cache, v_cache, k_token_scale, v_token_scale)
            return out
    options = make_options(0.0, softmax_scale, causal, window_size, softcap, False)
    kind = _kind(q, "q")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None and _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    _check_rank(k_cache, "k_cache", 4, "(batch_cache, seqlen_cache, nheads_k, headdim)")
    _check_rank(v_cache, "v_cache", 4, "(batch_cache, seqlen_cache, nheads_k, headdim_v)")
    if kind == "numpy":
        if scaled:
            raise TypeError("k_descale, v_descale, k_token_scale, v_token_scale: 8-bit caches "
                            "take torch tensors; numpy calls have float caches only")
        scales = None
    else:
        scales = cache_scales(k_cache, v_cache, q.shape[0], k_descale, v_descale, k_token_scale,
                              v_token_scale)
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and new values, or neither")
    if k is not None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            last = cache.strides[-1] // cache.itemsize if kind == "numpy" else cache.stride(-1)
            if cache.shape[-1] > 1 and last != 1:
                raise ValueError(f"{name}: the last dimension must be contiguous (stride 1) to be "
                                 f"appended to in place; got stride {last}")
    cache_seqlen = -1
    if cache_seqlens is not None and not hasattr(cache_seqlens, "shape"):
        cache_seqlen = int(cache_seqlens)
        if cache_seqlen < 0:
            raise ValueError(f"cache_seqlens: must be >= 0, got {cache_seqlens}")
        cache_seqlens = None
    if _on_cpu(q):
        q = kernel_query(q, options)
        if kind == "numpy":
            out, lse = kvcache_forward(
                q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                cache_batch_idx, cache_leftpad, block_table, bool(rotary_interleaved),
                kernel_options(options, alibi_slopes, sinks), int(num_splits))
        else:
            torch = torch_module()
            index = tuple(_index_tensor(torch, x) for x in (cache_batch_idx, cache_leftpad,
                                                            block_table))
            kopts = kernel_options(options, _f32(torch, alibi_slopes), _f32(torch, sinks))
            out, lse = _cache_ops.call(
                torch.ops.anyattn.fwd_kvcache, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                _index_tensor(torch, cache_seqlens), cache_seqlen, *index,
                bool(rotary_interleaved), *kopts.score_args(), int(num_splits),
                *(scales or (None,) * 4))
            if k is not None and not tracing():
                _mark_written(k_cache, v_cache, *(scales or ())[2:])
    else:
        call = CacheCall(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_seqlen, cache_batch_idx, cache_leftpad, block_table,
                         bool(rotary_interleaved), scales)
        out, lse = kvcache_on_device(q, call, options, _f32_on(q, alibi_slopes),
                                     _f32_on(q, sinks), int(num_splits), bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out


def _mark_written(*tensors) -> None:
    """Bumps the version counters of the torch tensors the library's append wrote in place (the
    caches, and the token scales of an 8-bit cache), as torch's own in-place ops do, so that
    autograd's saved-tensor checks and anything else that tracks in-place writes see the change."""
    from torch.autograd.graph import increment_version

    increment_version([t for t in tensors if t is not None])
