"""FlashAttention 3's flash_attn_with_kvcache beyond FA2's: packed queries and new keys
(cu_seqlens_q, cu_seqlens_k_new), rotary at per-sequence positions, attention_chunk and
seqused_q. The new keys are appended in torch (into an 8-bit cache by the library's quantization
rule, kv_quant.quantize_rows), then the plan runs as one read-only cache call."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._fa_arguments import as_int
from ._fa_plan import (Seqs, first_true_index, index_vector, page_table_of, plan_subsequences,
                       prefix_sums, query_extents, run_cache, unpack)
from ._kv_scales import CacheScales, cache_scales, descales_by_sequence, is_8bit
from ._kvcache_route import rotate, store_quantized
from ._options import AttnOptions
from ._segments import segment_positions


# ---- KV cache: appending new keys outside the kernel -------------------------------------------


def _new_tokens(k, v, cu_seqlens_k_new, batch: int, k_cache, v_cache):
    """(per-sequence counts (batch,), packed k (T, Hk, D), packed v) of the keys to append."""
    if k is None:
        if v is not None:
            raise ValueError("k, v: give both new keys and new values, or neither")
        return torch.zeros(batch, dtype=torch.int64), None, None
    if v is None:
        raise ValueError("k, v: give both new keys and new values, or neither")
    if cu_seqlens_k_new is None:
        if k.dim() != 4 or k.shape[0] != batch or tuple(v.shape[:2]) != tuple(k.shape[:2]):
            raise ValueError(f"k, v: expected ({batch}, seqlen_new, nheads_k, headdim) without "
                             f"cu_seqlens_k_new, got {tuple(k.shape)} and {tuple(v.shape)}")
        counts = torch.full((batch,), k.shape[1], dtype=torch.int64)
        k, v = k.reshape(-1, k.shape[2], k.shape[3]), v.reshape(-1, v.shape[2], v.shape[3])
    else:
        if k.dim() != 3 or v.dim() != 3 or v.shape[0] != k.shape[0]:
            raise ValueError(f"k, v: expected (total_new, nheads_k, headdim) with "
                             f"cu_seqlens_k_new, got {tuple(k.shape)} and {tuple(v.shape)}")
        cu = prefix_sums(cu_seqlens_k_new, "cu_seqlens_k_new", k.shape[0], batch + 1)
        counts, k, v = cu[1:] - cu[:-1], k[int(cu[0]):], v[int(cu[0]):]
    for name, new, cache in (("k", k, k_cache), ("v", v, v_cache)):
        if tuple(new.shape[1:]) != tuple(cache.shape[2:]):
            raise ValueError(f"{name}: heads and head dim {tuple(new.shape[1:])} differ from the "
                             f"cache's {tuple(cache.shape[2:])}")
        if is_8bit(cache):
            if new.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise TypeError(f"{name}: dtype {new.dtype} is not supported for an 8-bit cache; "
                                "new keys and values are float32, float16 or bfloat16 (the call "
                                "quantizes them)")
        elif new.dtype != cache.dtype:
            raise TypeError(f"{name}: dtype {new.dtype} differs from the cache's {cache.dtype}")
    return counts, k, v


def _rotary_rows(cos, sin, positions: torch.Tensor, head_dim: int):
    """cos/sin rows at ``positions``, after checking the table's shape and length."""
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if t is None or t.dim() != 2 or tuple(t.shape) != tuple(cos.shape):
            raise ValueError(f"{name}: expected (seqlen_ro, rotary_dim / 2) like rotary_cos, got "
                             f"{None if t is None else tuple(t.shape)}")
    if 2 * cos.shape[1] > head_dim:
        raise ValueError(f"rotary_cos: rotary_dim {2 * cos.shape[1]} exceeds the head dim "
                         f"{head_dim}")
    if positions.numel() and int(positions.max()) >= cos.shape[0]:
        raise ValueError(f"rotary_cos: {cos.shape[0]} positions, but position "
                         f"{int(positions.max())} is used; the table must cover every position")
    index = positions.to(cos.device)
    return cos.index_select(0, index), sin.index_select(0, index)


def append_to_cache(k_cache, v_cache, k_new, v_new, counts, stored, table, batch_idx,
                    rotary, rotary_base, scales: Optional[CacheScales] = None):
    """Write the packed new keys/values of sequence b at cache positions stored[b] + t, in place,
    rotating keys first when ``rotary`` = (cos, sin, interleaved) is given (positions
    rotary_base[b] + t). ``table``: paged cache rows; else ``batch_idx`` picks cache batches. An
    8-bit cache (``scales``) stores the rows quantized, with their token scales if it has them
    (sequence b's (B, Hk) descale row for its rows)."""
    seq, t = segment_positions(counts)
    pos = stored[seq] + t
    if table is not None:
        page, num_blocks = k_cache.shape[1], k_cache.shape[0]
        blocks = table[seq, pos // page]
        bad = (blocks < 0) | (blocks >= num_blocks)
        if bool(bad.any()):
            i = first_true_index(bad)
            raise ValueError(f"page_table: sequence {int(seq[i])} writes position {int(pos[i])} "
                             f"to block {int(blocks[i])}; supported: 0 .. {num_blocks - 1}")
        rows = pos % page
    else:
        blocks, rows = batch_idx[seq], pos
    with torch.no_grad():
        k_new = k_new.detach()
        if rotary is not None:
            cos, sin, interleaved = rotary
            c, s = _rotary_rows(cos, sin, rotary_base[seq] + t, k_new.shape[-1])
            k_new = rotate(k_new, c, s, interleaved, torch.float32 if scales else None)
        device = k_cache.device
        blocks, rows = blocks.to(device), rows.to(device)
        if scales is None:
            k_cache[blocks, rows] = k_new
            v_cache[blocks, rows] = v_new.detach()
            return
        # Each packed row is its own (sequence) row of the quantizer.
        store_quantized((blocks[:, None], rows[:, None]), k_new[:, None], v_new[:, None],
                        descales_by_sequence(scales, seq), k_cache, v_cache)


def _cache_geometry(k_cache, v_cache, page_table, cache_batch_idx, batch: int):
    """(table or None, batch_idx or None, capacity per sequence) of a paged or contiguous cache."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions (batch_cache or num_blocks, seqlen "
                             f"or page_block_size, nheads_k, headdim), got {tuple(cache.shape)}")
    if page_table is not None:
        table = page_table_of(page_table, batch, k_cache)
        return table, None, table.shape[1] * k_cache.shape[1]
    if cache_batch_idx is None:
        if k_cache.shape[0] < batch:
            raise ValueError(f"k_cache: {k_cache.shape[0]} cache batches for {batch} sequences; "
                             "pass cache_batch_idx, or a cache with a batch per sequence")
        return None, None, k_cache.shape[1]
    idx = index_vector(cache_batch_idx, "cache_batch_idx", batch)
    bad = (idx < 0) | (idx >= k_cache.shape[0])
    if bool(bad.any()):
        b = first_true_index(bad)
        raise ValueError(f"cache_batch_idx: sequence {b} reads cache batch {int(idx[b])}; "
                         f"supported: 0 .. {k_cache.shape[0] - 1}")
    return None, idx, k_cache.shape[1]


def _stored_lengths(cache_seqlens, batch: int, capacity: int, new: torch.Tensor):
    """Keys already in the cache per sequence; None means the cache is full after the append."""
    if cache_seqlens is None:
        return capacity - new
    if isinstance(cache_seqlens, torch.Tensor):
        return index_vector(cache_seqlens, "cache_seqlens", batch)
    return torch.full((batch,), as_int(cache_seqlens, "cache_seqlens", minimum=0),
                      dtype=torch.int64)


def kvcache_general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, page_table, cu_seqlens_q, cu_seqlens_k_new,
                    rotary_seqlens, options: AttnOptions, rotary_interleaved, chunk: int, sinks,
                    num_splits: int, scale_args=(None, None, None, None)):
    """flash_attn_with_kvcache for what anyattn's own call lacks (packed q with cu_seqlens_q,
    packed new keys with cu_seqlens_k_new, rotary_seqlens, attention_chunk): the append (and its
    rotary) in torch, then one read-only varlen cache call. scale_args: (k_descale, v_descale,
    k_token_scale, v_token_scale) of an 8-bit cache. Returns (out, lse) in q's layout."""
    pq, q0, q_used, q_span, q_end = query_extents(q, cu_seqlens_q, None)
    batch = q0.numel()
    table, batch_idx, capacity = _cache_geometry(k_cache, v_cache, page_table, cache_batch_idx,
                                                 batch)
    scales = cache_scales(k_cache, v_cache, batch, *scale_args)
    counts, k_new, v_new = _new_tokens(k, v, cu_seqlens_k_new if k is not None else None, batch,
                                       k_cache, v_cache)
    stored = _stored_lengths(cache_seqlens, batch, capacity, counts)
    pad = (torch.zeros_like(stored) if cache_leftpad is None
           else index_vector(cache_leftpad, "cache_leftpad", batch))
    bad = (stored < 0) | (stored + counts > capacity)
    if bool(bad.any()):
        b = first_true_index(bad)
        raise ValueError(f"cache_seqlens: sequence {b} holds {int(stored[b])} keys and appends "
                         f"{int(counts[b])}; supported: 0 .. {capacity} keys in all")
    bad = (pad < 0) | (pad > stored)
    if bool(bad.any()):
        b = first_true_index(bad)
        raise ValueError(f"cache_leftpad: sequence {b} starts at {int(pad[b])}; supported: "
                         f"0 .. cache_seqlens[{b}] = {int(stored[b])}")
    base = stored if rotary_seqlens is None else index_vector(rotary_seqlens, "rotary_seqlens",
                                                              batch)
    rotary = None if rotary_cos is None else (rotary_cos, rotary_sin, bool(rotary_interleaved))
    if k_new is not None:
        if batch_idx is not None and torch.unique(batch_idx).numel() != batch:
            raise ValueError(f"cache_batch_idx: repeats a cache batch ({batch_idx.tolist()[:16]}); "
                             "sequences that append need distinct cache batches")
        append_to_cache(k_cache, v_cache, k_new, v_new, counts, stored, table,
                        torch.arange(batch) if batch_idx is None else batch_idx, rotary, base,
                        scales)
    if rotary is not None:
        pq = _rotate_queries(pq, q0, q_span, q_end, base, rotary,
                             options.causal or options.has_window() or chunk > 0)
    seqs = Seqs(q0, q_used, q_span, pad, stored + counts - pad, q_end, 0)
    out, lse = run_cache(pq, k_cache, v_cache, plan_subsequences(seqs, chunk), table, batch_idx,
                         options, sinks, num_splits, scales)
    return unpack(out, lse, q, cu_seqlens_q is None)


def _rotate_queries(pq, q0, q_span, q_end, base, rotary, per_row: bool):
    """Packed q with sequence b's rows rotated at base[b] + i (``per_row``) or all at base[b]."""
    cos, sin, interleaved = rotary
    seq, i = segment_positions(q_span)
    pos = base[seq] + (i if per_row else torch.zeros_like(i))
    c, s = _rotary_rows(cos, sin, pos, pq.shape[-1])
    start = int(q0[0]) if q0.numel() else 0
    rotated = rotate(pq[start:q_end], c, s, interleaved)
    return torch.cat([pq[:start], rotated, pq[q_end:]])


def empty_accumulators(out: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """FA3's (out_accum, softmax_lse_accum) when no split partials are kept: empty tensors."""
    return (torch.empty((0,), dtype=torch.float32, device=out.device),
            torch.empty((0,), dtype=torch.float32, device=out.device))
