"""Drop-in replacements for flash-attn 2.x's varlen functions: packed sequences of different
lengths, and packed queries against a paged KV cache (``block_table``).

``flash_attn_varlen_func``, ``flash_attn_varlen_qkvpacked_func`` and
``flash_attn_varlen_kvpacked_func`` keep flash-attn 2.x's names, argument order, defaults and
return conventions, plus ``sinks=None`` and ``seqused_k=None``. numpy arrays and CPU torch tensors
run anyattn's C kernels (through torch.library ops for torch); torch tensors on other devices take
the packed device route (_packed_route.py). docs/varlen_kvcache.md has the semantics.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _core
from ._arguments import (_check_rank, _empty_s_dmask, _f32, _f32_on, _index_tensor, _kind,
                         _on_cpu)
from ._cache import kvcache_varlen_forward, varlen_forward
from ._cpu import reject_numpy_dropout
from ._kernel_options import kernel_options, kernel_query
from ._kv_scales import cache_scales, check_descale_values, reject_q_descale
from ._options import make_options
from ._plain_call import float32_per_head, tracing
from ._tensors import torch_module

if torch_module() is not None:
    from . import _cache_ops, _dropout
    from ._packed_route import varlen_on_device


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
            alibi_slopes, sinks, return_attn_probs, seqused_k=None):
    out, lse, s_dmask, _ = varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, options, alibi_slopes, sinks,
                                       return_attn_probs, seqused_k)
    return (out, lse, s_dmask) if return_attn_probs else out


def varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
                alibi_slopes, sinks, want_s_dmask, seqused_k=None):
    """The varlen forward on any supported input: (out, lse, S_dmask, rng_state).

    S_dmask follows flash-attn: an empty (0,) array/tensor unless ``want_s_dmask`` and dropout,
    else the dropout pattern (batch, Hq, round128(max_seqlen_q), round128(max_seqlen_k)).
    rng_state is the dropout (seed, offset) int64 tensor (2,) on CPU torch with dropout, else None.
    """
    kind = _kind(q, "q")
    for name, x in (("k", k), ("v", v)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 3, "(total_q, nheads, headdim)")
    _check_rank(k, "k", 3, "(total_k, nheads_k, headdim)")
    _check_rank(v, "v", 3, "(total_k, nheads_k, headdim_v)")
    rng_state = None
    s_dmask = _empty_s_dmask(q)
    if _on_cpu(q):
        q = kernel_query(q, options)
        lengths = (int(max_seqlen_q), int(max_seqlen_k))
        if kind == "numpy":
            reject_numpy_dropout(options.dropout_p)
            out, lse = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, *lengths,
                                      kernel_options(options, alibi_slopes, sinks))
        else:
            torch = torch_module()
            index = tuple(_index_tensor(torch, x) for x in (cu_seqlens_q, cu_seqlens_k, seqused_k))
            rng_state = _dropout.maybe_rng_state(options.dropout_p)
            kopts = kernel_options(options, _f32(torch, alibi_slopes), _f32(torch, sinks),
                                   rng_state)
            out, lse = torch.ops.anyattn.fwd_varlen(q, k, v, *index, *lengths, *kopts)
            if want_s_dmask and rng_state is not None:
                pattern = _dropout.varlen_dropout_pattern(q, k, *index, *lengths,
                                                          kopts.score_args(), options.dropout_p,
                                                          rng_state)
                s_dmask = _dropout.pad_to_blocks(pattern)
    else:
        out, lse = varlen_on_device(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                    int(max_seqlen_q), int(max_seqlen_k), options,
                                    _f32_on(q, alibi_slopes), _f32_on(q, sinks), want_s_dmask)
    return out, lse, s_dmask, rng_state


def _paged_key_lengths(kind: str, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                       page_size: int):
    """Per-sequence key counts (batch,) int32 for paged varlen (a numpy array, or a CPU tensor for
    torch inputs): seqused_k when given, else cu_seqlens_k's differences. Their shapes are checked
    here, and their values too outside torch.compile tracing (where the C ABI's checks, naming
    cache_seqlens, remain), so that errors name the argument the caller passed."""
    torch = torch_module()

    def as_int32(x):
        return np.asarray(x, dtype=np.int32) if kind == "numpy" else _index_tensor(torch, x)

    batch = len(cu_seqlens_q) - 1
    if seqused_k is not None:
        name, lengths = "seqused_k", as_int32(seqused_k)
        if tuple(lengths.shape) != (batch,):
            raise ValueError(f"seqused_k: expected shape ({batch},) (batch from cu_seqlens_q), "
                             f"got {tuple(lengths.shape)}")
    elif cu_seqlens_k is not None:
        cu_k = as_int32(cu_seqlens_k)
        if tuple(cu_k.shape) != (batch + 1,):
            raise ValueError(f"cu_seqlens_k: expected shape ({batch + 1},) (as cu_seqlens_q), "
                             f"got {tuple(cu_k.shape)}")
        name, lengths = "cu_seqlens_k", cu_k[1:] - cu_k[:-1]
    else:
        raise ValueError("cu_seqlens_k, seqused_k: with block_table, give seqused_k or "
                         "cu_seqlens_k for the key counts; both are None")
    tracing = torch is not None and torch.compiler.is_compiling()
    if block_table.ndim == 2 and not tracing:
        capacity = block_table.shape[1] * page_size
        for b, n in enumerate(lengths.tolist()):
            if n < 0 or n > capacity:
                raise ValueError(f"{name}: sequence {b} has {n} keys; supported: 0 .. {capacity} "
                                 f"(block_table's {block_table.shape[1]} blocks of {page_size})")
    return lengths


def _paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                  block_table, options, alibi_slopes, sinks, return_attn_probs, scale_args):
    """flash_attn_varlen_func with block_table: packed queries against a paged cache (an 8-bit
    one with ``scale_args`` = (k_descale, v_descale, k_token_scale, v_token_scale))."""
    kind = _kind(q, "q")
    for name, x in (("k", k_cache), ("v", v_cache), ("block_table", block_table)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 3, "(total_q, nheads, headdim)")
    _check_rank(k_cache, "k", 4,
                "(num_blocks, page_block_size, nheads_k, headdim) with block_table")
    _check_rank(v_cache, "v", 4,
                "(num_blocks, page_block_size, nheads_k, headdim_v) with block_table")
    if options.dropout_p > 0.0:
        raise NotImplementedError(
            f"flash_attn_varlen_func: dropout_p is {options.dropout_p}; with block_table (paged "
            "KV, an inference path) only dropout_p=0.0 is supported")
    if kind == "numpy":
        if any(s is not None for s in scale_args):
            raise TypeError("k_descale, v_descale, k_token_scale, v_token_scale: 8-bit caches "
                            "take torch tensors; numpy calls have float caches only")
        scales = None
    else:
        scales = cache_scales(k_cache, v_cache, block_table.shape[0], *scale_args)
    lengths = _paged_key_lengths(kind, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                 k_cache.shape[1])
    if _on_cpu(q):
        q = kernel_query(q, options)
        if kind == "numpy":
            out, lse = kvcache_varlen_forward(
                q, k_cache, v_cache, cu_seqlens_q, int(max_seqlen_q), lengths, -1, None, None,
                block_table, kernel_options(options, alibi_slopes, sinks), 0)
        else:
            torch = torch_module()
            kopts = kernel_options(options, _f32(torch, alibi_slopes), _f32(torch, sinks))
            out, lse = _cache_ops.call(
                torch.ops.anyattn.fwd_kvcache_varlen, q, k_cache, v_cache,
                _index_tensor(torch, cu_seqlens_q), int(max_seqlen_q),
                _index_tensor(torch, lengths), -1, None, None, _index_tensor(torch, block_table),
                *kopts.score_args(), 0, *(scales or (None,) * 4))
    else:
        out, lse = _paged_varlen_on_device(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q,
                                           lengths, block_table, options, alibi_slopes, sinks,
                                           return_attn_probs, scales)
    return (out, lse, _empty_s_dmask(q)) if return_attn_probs else out


def _paged_varlen_on_device(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, lengths,
                            block_table, options, alibi_slopes, sinks, want_lse, scales=None):
    """Torch tensors off the CPU: each sequence's pages gathered in one indexing operation (batch
    rows of max_blocks pages, the first lengths[b] keys in use; an 8-bit cache's dequantized to
    q's dtype, its (B, Hk) descales indexing the sequences), then one packed attention."""
    torch = torch_module()
    batch, max_blocks = block_table.shape
    page = k_cache.shape[1]
    table = block_table.to(device=k_cache.device, dtype=torch.long)
    keys = k_cache[table].reshape(batch, max_blocks * page, *k_cache.shape[2:])
    values = v_cache[table].reshape(batch, max_blocks * page, *v_cache.shape[2:])
    if scales is not None:
        from .kv_quant import dequantize_kv_cache  # noqa: PLC0415 - needs torch, as this route does

        check_descale_values(scales, appending=False)
        tokens = [None if t is None else t[table].reshape(batch, max_blocks * page, -1)
                  for t in (scales.k_token_scale, scales.v_token_scale)]
        keys = dequantize_kv_cache(keys, scales.k_descale, tokens[0], q.dtype)
        values = dequantize_kv_cache(values, scales.v_descale, tokens[1], q.dtype)
    keys, values = keys.flatten(0, 1), values.flatten(0, 1)
    capacity = max_blocks * page
    cu_k = torch.arange(batch + 1, device=q.device, dtype=torch.int32) * capacity
    used = torch.as_tensor(lengths).to(device=q.device)
    return varlen_on_device(q, keys, values, cu_seqlens_q, cu_k, used, int(max_seqlen_q), capacity,
                            options, _f32_on(q, alibi_slopes), _f32_on(q, sinks), want_lse)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, block_table=None, sinks=None,
    seqused_k=None, q_descale=None, k_descale=None, v_descale=None, k_token_scale=None,
    v_token_scale=None,
):
    """Attention over packed sequences of different lengths, flash-attn 2.x compatible.

    Arguments:
        q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k,
            headdim_v).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 prefix sums: sequence b is rows
            [cu_seqlens[b], cu_seqlens[b+1]).
        max_seqlen_q, max_seqlen_k: at least every sequence's length.
        causal / window_size / softcap / alibi_slopes ((nheads,) or (batch, nheads)) / sinks: as in
            flash_attn_func, applied per sequence (bottom-right aligned per sequence).
        block_table: optional (batch, max_blocks) int32: paged varlen (as vLLM calls it). k and v
            are then paged caches (num_blocks, page_block_size, nheads_k, headdim[_v]), any
            page_block_size >= 1; sequence b's keys are its positions 0 .. n_b - 1, with n_b =
            seqused_k[b] if given, else cu_seqlens_k[b+1] - cu_seqlens_k[b] (cu_seqlens_k may
            then be None). The caches are only read; no dropout and no backward on this path.
        seqused_k: optional (batch,) int32: sequence b uses only its first seqused_k[b] keys.
        k_descale, v_descale, k_token_scale, v_token_scale (with block_table only):
            the scales of an 8-bit paged cache (torch.float8_e4m3fn, torch.float8_e5m2 or
            torch.int8), as in flash_attn_with_kvcache; (batch, nheads_k) descales are indexed
            by sequence. q_descale: None only.
        dropout_p: as in flash_attn_func (torch tensors only); sequence b uses batch index b's
            mask with positions counted within the sequence. return_attn_probs with dropout raises
            NotImplementedError.
        deterministic: accepted; results are always deterministic.
    Autograd (torch): q, k, v and sinks get gradients (anyattn_bwd_varlen); alibi_slopes none.
    Returns:
        out (total_q, nheads, headdim_v); with return_attn_probs, (out, softmax_lse
        (nheads, total_q) float32, None).
    """
    scale_args = (k_descale, v_descale, k_token_scale, v_token_scale)
    if q_descale is None and not tracing():
        # A plain CPU torch call runs in one C function (_plain_call.py); against a paged cache
        # (8-bit too) when seqused_k gives the key counts.
        out = None
        alibi, head_sinks = float32_per_head(alibi_slopes), float32_per_head(sinks)
        if block_table is None and scale_args == (None,) * 4:
            out = _core.fwd_varlen_torch_plain(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               max_seqlen_k, dropout_p, softmax_scale, causal,
                                               window_size, softcap, alibi, return_attn_probs,
                                               head_sinks, seqused_k)
        elif block_table is not None and seqused_k is not None and max_seqlen_q is not None:
            out = _core.fwd_kvcache_varlen_torch_plain(
                q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, block_table, dropout_p,
                softmax_scale, causal, window_size, softcap, alibi, return_attn_probs,
                head_sinks, 0, *scale_args)
        if isinstance(out, tuple):  # (out, lse): return_attn_probs
            return out + (_empty_s_dmask(q),)
        if out is not None:
            return out
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    reject_q_descale(q_descale)
    if block_table is not None:
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                             block_table, options, alibi_slopes, sinks, return_attn_probs,
                             scale_args)
    for name, value in zip(("k_descale", "v_descale", "k_token_scale", "v_token_scale"),
                           scale_args):
        if value is not None:
            raise ValueError(f"{name}: given without block_table; 8-bit keys/values are read "
                             "from a paged KV cache only (pass block_table)")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
                   alibi_slopes, sinks, return_attn_probs, seqused_k)


def flash_attn_varlen_qkvpacked_func(
    qkv, cu_seqlens, max_seqlen, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash_attn_varlen_func on packed qkv (total, 3, nheads, headdim): strided views, no copy."""
    _kind(qkv, "qkv")
    if qkv.ndim != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv: expected shape (total, 3, nheads, headdim), got {tuple(qkv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen,
                   max_seqlen, options, alibi_slopes, sinks, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash_attn_varlen_func with packed kv (total_k, 2, nheads_k, headdim): views, no copy."""
    _kind(kv, "kv")
    if kv.ndim != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv: expected shape (total_k, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _varlen(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   options, alibi_slopes, sinks, return_attn_probs)
