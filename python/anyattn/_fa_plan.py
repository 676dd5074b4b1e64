"""How the FlashAttention 3 and 4 call styles run on anyattn's flash-attn 2.x functions: their
sequences (packed or batched, with seqused_q/seqused_k), the split into sub-sequences that
attention_chunk needs, one varlen call per plan (over packed keys or a read-only cache), and the
merge of split partials (flash_attn_combine)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
import torch

from . import _cache_ops, _core
from ._checks import check_dense_shapes, check_same_dtype
from ._fa_arguments import describe_value
from ._kernel_options import kernel_options, kernel_query
from ._kv_scales import descales_by_sequence
from ._options import AttnOptions
from ._plain_call import float32_per_head, tracing
from ._segments import segment_positions_np
from .flash_attn_interface import flash_attn_func as _fa2_func
from .varlen import flash_attn_varlen_func as _fa2_varlen_func


# ---- Sequences, and their split into sub-sequences --------------------------------------------


class Seqs(NamedTuple):
    """Where each sequence's rows and keys are: int64 CPU tensors of shape (batch,), plus ends.

    Queries of sequence b are rows q0[b] .. q0[b] + q_span[b] - 1 of the packed q; the first
    q_used[b] of them are computed (and aligned as a sequence of that length), the rest are left
    0 / -inf. Its keys are k_used[b] positions from k0[b]: rows of a packed k, or cache positions.
    """

    q0: torch.Tensor
    q_used: torch.Tensor
    q_span: torch.Tensor
    k0: torch.Tensor
    k_used: torch.Tensor
    q_end: int
    k_end: int


class Plan(NamedTuple):
    """Sub-sequences for one varlen call: rows cu_q[j] .. cu_q[j+1] - 1 attend keys k_lo[j] ..
    k_hi[j] - 1 of sequence seq[j] (bottom-right aligned within the sub-sequence)."""

    cu_q: torch.Tensor  # (N + 1,) int32
    k_lo: torch.Tensor  # (N,) int64
    k_hi: torch.Tensor  # (N,) int64
    seq: torch.Tensor  # (N,) int64
    max_q: int


def plan_subsequences(s: Seqs, chunk: int) -> Plan:
    """Split each sequence into sub-sequences a plain varlen call computes exactly.

    Every sequence b gives, in order: the rows whose diagonal key i + Sk - Sq is negative (they
    see no key under chunking; none without it), one sub-sequence per key chunk (the whole key
    range without chunking), and the rows beyond q_used (no keys). A chunk's sub-sequence holds
    the rows whose diagonal falls in the chunk and the chunk's keys; its rows and keys keep their
    distance to the diagonal, so causal and window masks apply unchanged. Built with numpy array
    operations (_segments.py says why not torch's), without a loop over sequences.
    """
    qu, ku = s.q_used.numpy(), s.k_used.numpy()
    n_chunks = (ku + chunk - 1) // chunk if chunk > 0 else np.ones_like(ku)
    per_seq = n_chunks + 2
    seq, c = segment_positions_np(per_seq)
    c = c - 1  # -1: the negative diagonals' rows; n_chunks: the unused rows
    qu, ku = qu[seq], ku[seq]
    if chunk > 0:
        offset = ku - qu  # diagonal key of row i is i + offset
        row = np.minimum(np.where(c < 0, 0, np.maximum(c * chunk - offset, 0)), qu)
        k_lo = np.where(c < 0, 0, np.minimum(c * chunk, ku))
        k_hi = np.where(c < 0, 0, np.minimum((c + 1) * chunk, ku))
    else:
        row = np.where(c > 0, qu, 0)
        k_lo = np.where(c > 0, ku, 0)
        k_hi = np.where(c < 0, 0, ku)
    cu_q = np.append(s.q0.numpy()[seq] + row, s.q_end)
    k0 = s.k0.numpy()[seq]
    max_q = int(np.diff(cu_q).max()) if seq.size else 0
    return Plan(torch.from_numpy(cu_q.astype(np.int32)), torch.from_numpy(k0 + k_lo),
                torch.from_numpy(k0 + k_hi), torch.from_numpy(seq), max(max_q, 1))


def unused_rows(s: Seqs, total_q: int) -> torch.Tensor:
    """(total_q,) bool: rows owned by a sequence beyond its q_used (not computed)."""
    delta = torch.zeros(total_q + 1, dtype=torch.int64)
    delta.index_add_(0, s.q0 + s.q_used, torch.ones_like(s.q0))
    delta.index_add_(0, s.q0 + s.q_span, -torch.ones_like(s.q0))
    return torch.cumsum(delta, 0)[:-1] > 0


def index_vector(x: Any, name: str, length: Optional[int] = None) -> torch.Tensor:
    """An int64 CPU copy of a 1-D integer tensor/list, of ``length`` entries when given."""
    t = torch.as_tensor(x)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor (int32), got dtype {t.dtype}")
    if t.dim() != 1 or (length is not None and t.numel() != length):
        want = f"({length},)" if length is not None else "1-D"
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    return t.to(device="cpu", dtype=torch.int64)


def first_true_index(bad: torch.Tensor) -> int:
    return int(torch.nonzero(bad)[0, 0])


def prefix_sums(x: Any, name: str, total: int, length: Optional[int] = None) -> torch.Tensor:
    """A checked cu_seqlens vector: non-negative, non-decreasing, last entry <= ``total``."""
    cu = index_vector(x, name, length)
    if cu.numel() < 1:
        raise ValueError(f"{name}: expected at least one entry (batch + 1), got shape (0,)")
    steps = cu[1:] - cu[:-1]
    if cu[0] < 0 or bool((steps < 0).any()) or cu[-1] > total:
        raise ValueError(f"{name}: must start >= 0, never decrease and end <= {total} (the rows "
                         f"of its tensor), got {cu.tolist()[:16]}")
    return cu


def _used_counts(x: Any, name: str, span: torch.Tensor, what: str) -> torch.Tensor:
    """A checked seqused vector: one count per sequence in 0 .. span[b]."""
    used = index_vector(x, name, span.numel())
    bad = (used < 0) | (used > span)
    if bool(bad.any()):
        b = first_true_index(bad)
        raise ValueError(f"{name}: sequence {b} uses {int(used[b])} {what}; supported: "
                         f"0 .. {int(span[b])}")
    return used


def query_extents(q: torch.Tensor, cu_seqlens_q: Any, seqused_q: Any):
    """(packed q (total, H, D), q0, q_used, q_span, q_end) for batched q (cu_seqlens_q None:
    q is (batch, seqlen_q, H, D)) or packed q with its cu_seqlens_q."""
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise ValueError(f"q: expected (batch, seqlen_q, nheads, headdim) without "
                             f"cu_seqlens_q, got shape {tuple(q.shape)}")
        b, sq = q.shape[0], q.shape[1]
        q0 = torch.arange(b, dtype=torch.int64) * sq
        span = torch.full((b,), sq, dtype=torch.int64)
        packed, q_end = q.reshape(b * sq, q.shape[2], q.shape[3]), b * sq
    else:
        if q.dim() != 3:
            raise ValueError(f"q: expected (total_q, nheads, headdim) with cu_seqlens_q, got "
                             f"shape {tuple(q.shape)}")
        cu = prefix_sums(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
        q0, span, packed, q_end = cu[:-1], cu[1:] - cu[:-1], q, int(cu[-1])
    used = span if seqused_q is None else _used_counts(seqused_q, "seqused_q", span, "queries")
    return packed, q0, used, span, q_end


def key_extents(k: torch.Tensor, v: torch.Tensor, cu_seqlens_k: Any, seqused_k: Any,
                batch: int):
    """(packed k, packed v, k0, k_used, k_end) for batched k/v (batch, seqlen_k, Hk, D) or
    packed k/v (total_k, Hk, D) with cu_seqlens_k; seqused_k limits each sequence's keys."""
    if cu_seqlens_k is None:
        if k.dim() != 4 or k.shape[0] != batch or v.dim() != 4:
            raise ValueError(f"k: expected ({batch}, seqlen_k, nheads_k, headdim) without "
                             f"cu_seqlens_k, got shape {tuple(k.shape)}")
        sk = k.shape[1]
        k0 = torch.arange(batch, dtype=torch.int64) * sk
        span = torch.full((batch,), sk, dtype=torch.int64)
        pk = k.reshape(batch * sk, k.shape[2], k.shape[3])
        pv = v.reshape(v.shape[0] * v.shape[1], v.shape[2], v.shape[3])
        k_end = batch * sk
    else:
        if k.dim() != 3 or v.dim() != 3:
            raise ValueError(f"k: expected (total_k, nheads_k, headdim) with cu_seqlens_k, got "
                             f"shape {tuple(k.shape)}")
        cu = prefix_sums(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch + 1)
        k0, span, pk, pv, k_end = cu[:-1], cu[1:] - cu[:-1], k, v, int(cu[-1])
    used = span if seqused_k is None else _used_counts(seqused_k, "seqused_k", span, "keys")
    return pk, pv, k0, used, k_end


# ---- Running a plan ---------------------------------------------------------------------------


def _lse_of(result) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) from a flash-attn 2.x ``return_attn_probs=True`` result."""
    return result[0], result[1]


def run_packed(q, k, v, plan: Plan, k_end: int, options: AttnOptions, sinks):
    """The plan over packed q (total_q, Hq, D) and packed k/v: one anyattn varlen call (with
    autograd). Returns (out (total_q, Hq, Dv), lse (Hq, total_q))."""
    cu_k = torch.cat([plan.k_lo, torch.tensor([k_end])])
    max_k = int((cu_k[1:] - cu_k[:-1]).max()) if plan.seq.numel() else 0
    return _lse_of(_fa2_varlen_func(
        q, k, v, plan.cu_q, cu_k.to(torch.int32), plan.max_q, max(max_k, 1),
        softmax_scale=options.softmax_scale, causal=options.causal,
        window_size=options.window_size, softcap=options.softcap, return_attn_probs=True,
        sinks=sinks, seqused_k=(plan.k_hi - plan.k_lo).to(torch.int32)))


def run_cache(q, k_cache, v_cache, plan: Plan, table, batch_idx, options: AttnOptions, sinks,
              num_splits: int, scales=None):
    """The plan over packed q against a cache it only reads: paged (``table`` (batch,
    max_blocks)) or contiguous (sequence b reads cache batch ``batch_idx[b]``, default b); the
    plan's keys are cache positions. ``scales``: an 8-bit cache's (_kv_scales.CacheScales; a
    (B, Hk) descale row is sequence b's, repeated for each of its sub-sequences). Forward only.
    Returns (out (total_q, Hq, Dv), lse (Hq, total_q)); tensors off the CPU are computed on CPU
    copies."""
    if scales is None:
        check_same_dtype((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    device = q.device
    if table is not None:
        block_table, cache_batch = table.index_select(0, plan.seq).to(torch.int32), None
    else:
        rows = plan.seq if batch_idx is None else batch_idx.index_select(0, plan.seq)
        block_table, cache_batch = None, rows.to(torch.int32)
    scale_args = (None,) * 4
    if scales is not None:
        scale_args = tuple(None if x is None else x.cpu()
                           for x in descales_by_sequence(scales, plan.seq))
    if device.type != "cpu":
        q, k_cache, v_cache = q.cpu(), k_cache.cpu(), v_cache.cpu()
    sinks = None if sinks is None else torch.as_tensor(sinks).to(device="cpu",
                                                                 dtype=torch.float32)
    kopts = kernel_options(options, None, sinks)
    out, lse = _cache_ops.call(
        torch.ops.anyattn.fwd_kvcache_varlen, kernel_query(q, options), k_cache, v_cache,
        plan.cu_q, plan.max_q, plan.k_hi.to(torch.int32), -1, cache_batch,
        plan.k_lo.to(torch.int32), block_table, *kopts.score_args(), max(num_splits, 0),
        *scale_args)
    return out.to(device), lse.to(device)


def plain_cache_call(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, table,
                     options: AttnOptions, sinks, num_splits: int, need_lse: bool,
                     scales=(None,) * 4, qv=None):
    """q packed (total_q, Hq, D) with cu_seqlens_q, or batched (batch, seqlen_q, Hq, D) with
    cu_seqlens_q None, against a cache read in place (paged with ``table``, else contiguous; keys
    0 .. cache_seqlens[b] - 1 of sequence b), without chunks or seqused_q: a sequence per plan
    entry, so a plain call runs in one C function (_plain_call.py); ``scales``: an 8-bit
    cache's (k_descale, v_descale, k_token_scale, v_token_scale); ``qv``: FA3's value-side query
    in q's layout, plain where q and qv, and k_cache and v_cache, are column ranges of one row
    ([qv | q] against the latent row [v | k]). Returns (out, lse) in q's layout (lse None
    without ``need_lse``), or None, having done nothing, when the call is not plain (the caller
    then plans it)."""
    if tracing():
        return None
    batched = cu_seqlens_q is None
    packed, packed_qv = q, qv
    if batched:
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] * q.shape[1] == 0:
            return None
        b, sq = q.shape[0], q.shape[1]
        cu_seqlens_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32)
        packed = q.reshape(b * sq, q.shape[2], q.shape[3])
        if qv is not None:
            if not isinstance(qv, torch.Tensor) or qv.dim() != 4:
                return None
            packed_qv = qv.reshape(b * sq, qv.shape[2], qv.shape[3])
    result = _core.fwd_kvcache_varlen_torch_plain(
        packed, k_cache, v_cache, cu_seqlens_q, None, cache_seqlens, table, 0.0,
        options.softmax_scale, options.causal, options.window_size, options.softcap, None,
        bool(need_lse), float32_per_head(sinks), num_splits, *scales, packed_qv)
    if result is None:
        return None
    out, lse = result if need_lse else (result, None)
    if not batched:
        return out, lse
    if lse is None:
        return out.reshape(b, sq, out.shape[1], out.shape[2]), None
    return unpack(out, lse, q, True)


def forget_unused_rows(lse: torch.Tensor, s: Seqs) -> torch.Tensor:
    """lse (Hq, total_q) with -inf in rows beyond q_used (a sink would otherwise stand there)."""
    dead = unused_rows(s, lse.shape[1]).to(lse.device)
    return lse.masked_fill(dead[None, :], -math.inf)


def unpack(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, batched: bool):
    """Packed (total, Hq, Dv) / (Hq, total) back to q's batched layout when ``batched``:
    (batch, seqlen_q, Hq, Dv) and (batch, Hq, seqlen_q)."""
    if not batched:
        return out, lse
    b, sq = q.shape[0], q.shape[1]
    out = out.reshape(b, sq, out.shape[1], out.shape[2])
    lse = lse.reshape(lse.shape[0], b, sq).permute(1, 0, 2).contiguous()
    return out, lse


def dense_attention(q, k, v, options: AttnOptions, chunk: int, sinks, need_lse: bool = True):
    """(out (B, Sq, Hq, Dv), lse (B, Hq, Sq)) of q (B, Sq, Hq, D) against k/v (B, Sk, Hk, D[v]).
    Without ``need_lse`` the lse may be None: a call without chunks then takes flash_attn_func's
    plain path (_plain_call.py), which allocates none."""
    if chunk == 0:
        result = _fa2_func(q, k, v, softmax_scale=options.softmax_scale, causal=options.causal,
                           window_size=options.window_size, softcap=options.softcap,
                           return_attn_probs=need_lse, sinks=sinks)
        return _lse_of(result) if need_lse else (result, None)
    check_dense_shapes(q, k, v)
    return varlen_attention(q, k, v, None, None, None, None, None, None, None, options, sinks,
                            chunk, 0)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     seqused_q, seqused_k, page_table, options: AttnOptions, sinks, chunk: int,
                     num_splits: int, need_lse: bool = True):
    """FA3/FA4 varlen semantics: q packed with cu_seqlens_q or batched without; k/v packed with
    cu_seqlens_k, batched without, or a paged cache with page_table. Returns (out, lse) in q's
    layout: (total_q, Hq, Dv) and (Hq, total_q), or (B, Sq, Hq, Dv) and (B, Hq, Sq). Without
    ``need_lse`` the lse may be None (a packed call then takes flash_attn_varlen_func's plain
    path)."""
    if page_table is not None and cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k: must be None with page_table (the key counts come from "
                         "seqused_k, else every sequence has the page_table's full capacity)")
    if (cu_seqlens_q is not None and cu_seqlens_k is not None and page_table is None
            and seqused_q is None and chunk == 0):
        if max_seqlen_q is None or max_seqlen_k is None:
            max_seqlen_q = _max_length(cu_seqlens_q) if max_seqlen_q is None else max_seqlen_q
            max_seqlen_k = _max_length(cu_seqlens_k) if max_seqlen_k is None else max_seqlen_k
        result = _fa2_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=options.softmax_scale, causal=options.causal,
            window_size=options.window_size, softcap=options.softcap,
            return_attn_probs=need_lse, sinks=sinks, seqused_k=seqused_k)
        return _lse_of(result) if need_lse else (result, None)
    if page_table is not None and seqused_q is None and chunk == 0:
        result = plain_cache_call(q, k, v, cu_seqlens_q, seqused_k, page_table, options, sinks,
                                  num_splits, need_lse)
        if result is not None:
            return result
    pq, q0, q_used, q_span, q_end = query_extents(q, cu_seqlens_q, seqused_q)
    batch = q0.numel()
    if page_table is not None:
        table, k_used = paged_keys(page_table, k, batch, seqused_k)
        seqs = Seqs(q0, q_used, q_span, torch.zeros_like(q0), k_used, q_end, 0)
        out, lse = run_cache(pq, k, v, plan_subsequences(seqs, chunk), table, None, options,
                             sinks, num_splits)
    else:
        pk, pv, k0, k_used, k_end = key_extents(k, v, cu_seqlens_k, seqused_k, batch)
        seqs = Seqs(q0, q_used, q_span, k0, k_used, q_end, k_end)
        out, lse = run_packed(pq, pk, pv, plan_subsequences(seqs, chunk), k_end, options, sinks)
    if seqused_q is not None and sinks is not None:
        lse = forget_unused_rows(lse, seqs)
    return unpack(out, lse, q, cu_seqlens_q is None)


def paged_keys(page_table: Any, k_cache: torch.Tensor, batch: int, seqused_k: Any):
    """(table (batch, max_blocks), keys per sequence) of a paged cache read through page_table:
    seqused_k[b] keys, else the table's full capacity."""
    table = page_table_of(page_table, batch, k_cache)
    span = torch.full((batch,), table.shape[1] * k_cache.shape[1], dtype=torch.int64)
    return table, span if seqused_k is None else _used_counts(seqused_k, "seqused_k", span, "keys")


def _max_length(cu: Any) -> int:
    c = index_vector(cu, "cu_seqlens")
    return max(int((c[1:] - c[:-1]).max()), 1) if c.numel() > 1 else 1


def page_table_of(page_table: Any, batch: int, k_cache: torch.Tensor) -> torch.Tensor:
    """A checked (batch, max_blocks) int64 CPU copy of page_table, for a 4-D paged cache."""
    table = torch.as_tensor(page_table)
    if table.dim() != 2 or table.shape[0] != batch:
        raise ValueError(f"page_table: expected shape ({batch}, max_num_blocks_per_seq), got "
                         f"{tuple(table.shape)}")
    if table.is_floating_point():
        raise TypeError(f"page_table: expected an integer tensor (int32), got {table.dtype}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache: expected (num_blocks, page_block_size, nheads_k, headdim) "
                         f"with page_table, got shape {tuple(k_cache.shape)}")
    return table.to(device="cpu", dtype=torch.int64)


# ---- Combining split partials -----------------------------------------------------------------


def combine_partials(out_partial: torch.Tensor, lse_partial: torch.Tensor, out_dtype):
    """Merge num_splits partial results over disjoint keys.

    out_partial (num_splits, ..., H, D), lse_partial (num_splits, ..., H) natural log (-inf =
    empty split). Returns (out (..., H, D) in ``out_dtype``, lse (..., H) float32); rows whose
    splits are all empty give out 0 and lse -inf. Computed in float32.
    """
    if not isinstance(out_partial, torch.Tensor) or out_partial.dim() not in (4, 5):
        raise ValueError("out_partial: expected (num_splits, batch, seqlen, nheads, headdim) or "
                         f"(num_splits, total_q, nheads, headdim), got {describe_value(out_partial)}")
    if not isinstance(lse_partial, torch.Tensor) or (
            tuple(lse_partial.shape) != tuple(out_partial.shape[:-1])):
        raise ValueError(f"lse_partial: expected shape {tuple(out_partial.shape[:-1])} "
                         f"(out_partial's without headdim), got {describe_value(lse_partial)}")
    lse_parts = lse_partial.to(torch.float32)
    lse = torch.logsumexp(lse_parts, dim=0)
    weight = torch.exp(lse_parts - lse.unsqueeze(0))
    weight = torch.where(torch.isfinite(weight), weight, torch.zeros_like(weight))
    out = (weight.unsqueeze(-1) * out_partial.to(torch.float32)).sum(0)
    return out.to(out_partial.dtype if out_dtype is None else out_dtype), lse
