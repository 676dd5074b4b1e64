"""flash-attn 2.x functions whose C kernels do not exist yet (varlen, KV cache).

They keep flash-attn's signatures so that code importing them still imports, and raise
NotImplementedError naming what works today. None of them ever silently ignores an argument.
"""

from __future__ import annotations

from typing import Optional, Tuple

_VARLEN = (
    "{name} is not implemented by anyattn yet: the varlen kernels arrive in a later release. "
    "Until then call anyattn.flash_attn_func once per sequence on the slices "
    "q[cu_seqlens_q[i]:cu_seqlens_q[i+1]][None] (and likewise k, v), or use "
    "anyattn.integrations.sglang.VisionAnyAttention, which does exactly that for packed batches."
)

_KVCACHE = (
    "flash_attn_with_kvcache is not implemented by anyattn yet: the KV-cache kernels arrive in a "
    "later release. Until then write the new k/v into your cache yourself and call "
    "anyattn.flash_attn_func(q, k_cache[:, :seqlen], v_cache[:, :seqlen], causal=...) on the "
    "filled part (causal masks are bottom-right aligned, so decode steps need no offset)."
)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, block_table=None, sinks=None,
):
    """flash-attn's varlen attention. Not implemented yet: always raises NotImplementedError."""
    raise NotImplementedError(_VARLEN.format(name="flash_attn_varlen_func"))


def flash_attn_varlen_qkvpacked_func(
    qkv, cu_seqlens, max_seqlen, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash-attn's packed varlen attention. Not implemented yet: always raises NotImplementedError."""
    raise NotImplementedError(_VARLEN.format(name="flash_attn_varlen_qkvpacked_func"))


def flash_attn_varlen_kvpacked_func(
    q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash-attn's kv-packed varlen attention. Not implemented yet: always raises NotImplementedError."""
    raise NotImplementedError(_VARLEN.format(name="flash_attn_varlen_kvpacked_func"))


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
    alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False, sinks=None,
):
    """flash-attn's KV-cache attention. Not implemented yet: always raises NotImplementedError."""
    raise NotImplementedError(_KVCACHE)
