"""FlashAttention 3's Python API (its top-level ``flash_attn_interface`` module) on anyattn.

The public functions keep FA3's names, positional order, defaults and return values
(Dao-AILab/flash-attention ``hopper/flash_attn_interface.py``), so code written for FA3 runs on
CPU torch tensors (other devices go through anyattn's device dispatch). They are thin mappings onto
anyattn's flash-attn 2.x functions:

- ``window_size``: (left, right), -1 (or None) unbounded; ``causal`` forces right = 0. Masks are
  bottom-right aligned, per sequence.
- ``page_table`` is anyattn's ``block_table`` (any page size). ``sinks`` and ``learnable_sink``
  (keyword-only: sglang's FA3 build and FA4 name them so; upstream FA3 has neither) are per-head
  sink logits joining the softmax denominator; the LSE includes them.
- ``seqused_q``: sequence b computes only its first seqused_q[b] queries, aligned as a sequence of
  that length; its remaining rows are 0 in out and -inf in the LSE (FA3 leaves them unwritten).
- ``attention_chunk`` > 0: on top of causal/window, query i sees key j only if j lies in the same
  chunk of ``attention_chunk`` key positions as i's diagonal key i + Sk - Sq (chunks counted from
  the sequence's first key, after ``cache_leftpad``). Runs as a varlen call with one sub-sequence
  per (sequence, chunk), which keeps the autograd of the dense and varlen functions.
- Performance hints are accepted and change nothing: ``num_splits``, ``pack_gqa``, ``sm_margin``,
  ``deterministic`` (anyattn is always deterministic), ``scheduler_metadata``.
- What a CPU cannot honour raises NotImplementedError naming the parameter, only when it is given
  a non-default value: ``qv`` and the FP8 ``q_descale``/``k_descale``/``v_descale``.
- The LSE is float32, natural log, not differentiable (as in FA3).

The private helpers are shared with ``fa4_interface``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Tuple

import torch

from . import _cache_ops
from ._checks import check_dense_shapes, check_same_dtype
from ._options import AttnOptions, make_options
from .flash_attn_interface import flash_attn_func as _fa2_func
from ._kvcache_route import rotate
from ._kernel_options import kernel_options, kernel_query
from .kvcache import flash_attn_with_kvcache as _fa2_kvcache
from .varlen import flash_attn_varlen_func as _fa2_varlen_func

__all__ = [
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
]

# ---- Argument handling ----------------------------------------------------------------------

# Parameters of FA3/FA4 that anyattn cannot honour, with what they are for.
_UNSUPPORTED = {
    "qv": "the extra q.v score term of absorbed MLA",
    "q_descale": "FP8 descaling; anyattn has no FP8 or quantized inputs",
    "k_descale": "FP8 descaling; anyattn has no FP8 or quantized inputs",
    "v_descale": "FP8 descaling; anyattn has no FP8 or quantized inputs",
    "gather_kv_indices": "top-k gathering of keys for sparse absorbed MLA",
    "score_mod": "a CuTe-DSL score modifier, compiled for NVIDIA GPUs",
    "score_mod_bwd": "a CuTe-DSL score modifier, compiled for NVIDIA GPUs",
    "mask_mod": "a CuTe-DSL mask modifier, compiled for NVIDIA GPUs",
    "aux_tensors": "captured tensors of score_mod/mask_mod",
    "aux_scalars": "captured scalars of score_mod/mask_mod",
    "block_sparse_tensors": "block-sparse attention",
    "block_sparse_tensors_bwd": "block-sparse attention",
    "full_block_cnt": "block-sparse attention (an older FA4 keyword)",
    "full_block_idx": "block-sparse attention (an older FA4 keyword)",
    "mask_block_cnt": "block-sparse attention (an older FA4 keyword)",
    "mask_block_idx": "block-sparse attention (an older FA4 keyword)",
    "block_size": "block-sparse attention (an older FA4 keyword)",
    "cu_total_m_blocks": "block-sparse attention (an older FA4 keyword)",
    "cu_total_n_blocks": "block-sparse attention (an older FA4 keyword)",
    "varlen_batch_idx": "the batch remapping of FA4's persistent scheduler",
}


def reject_unsupported(**given: Any) -> None:
    """Raise NotImplementedError for the first parameter in ``given`` holding a non-default value.

    None is the default of each; an empty list/tuple (``aux_tensors=[]``) counts as None.
    """
    for name, value in given.items():
        if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
            continue
        raise NotImplementedError(
            f"{name}: not supported by anyattn ({_UNSUPPORTED[name]}); got "
            f"{_describe(value)}, pass {name}=None")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


def as_int(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as an int (TypeError otherwise), at least ``minimum`` (ValueError otherwise)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {_describe(value)}")
    result = int(value.__index__())
    if minimum is not None and result < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {result}")
    return result


def check_hints(**hints: Any) -> None:
    """Type-check performance hints that are accepted and otherwise ignored (ints or None)."""
    for name, value in hints.items():
        if value is not None:
            as_int(value, name)


def chunk_size(attention_chunk: Any) -> int:
    """FA3's ``attention_chunk`` as an int >= 0 (0 = off); None is read as 0."""
    if attention_chunk is None:
        return 0
    return as_int(attention_chunk, "attention_chunk", minimum=0)


def pick_sinks(sinks: Any, learnable_sink: Any) -> Any:
    """The sink logits given under either name; both at once is a ValueError."""
    if sinks is not None and learnable_sink is not None:
        raise ValueError("sinks, learnable_sink: two names for the same per-head sink logits; "
                         "pass one of them")
    return learnable_sink if sinks is None else sinks


def window_pair(window_size: Any) -> Tuple[Any, Any]:
    """``window_size`` as a (left, right) pair with None sides read as -1; None means (-1, -1)."""
    if window_size is None:
        return -1, -1
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair (left, right), got "
                        f"{window_size!r}") from None
    return (-1 if left is None else left), (-1 if right is None else right)


def fa3_options(softmax_scale, causal, window_size, softcap, deterministic) -> AttnOptions:
    """Checked options of an FA3 call (FA3's window convention is flash-attn 2.x's)."""
    return make_options(0.0, softmax_scale, causal, window_pair(window_size),
                        0.0 if softcap is None else softcap, deterministic)


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
    distance to the diagonal, so causal and window masks apply unchanged. Built with tensor ops,
    without a loop over sequences.
    """
    batch = s.q0.numel()
    qu, ku = s.q_used, s.k_used
    if chunk > 0:
        n_chunks = (ku + chunk - 1) // chunk
    else:
        n_chunks = torch.ones_like(ku)
    per_seq = n_chunks + 2
    seq = torch.repeat_interleave(torch.arange(batch), per_seq)
    first = torch.cumsum(per_seq, 0) - per_seq
    c = torch.arange(seq.numel()) - first[seq] - 1  # -1: negative diagonals; n: unused rows
    qu, ku = qu[seq], ku[seq]
    if chunk > 0:
        offset = ku - qu  # diagonal key of row i is i + offset
        row = torch.where(c < 0, torch.zeros_like(c), (c * chunk - offset).clamp(min=0))
        row = torch.minimum(row, qu)
        k_lo = torch.where(c < 0, torch.zeros_like(c), torch.minimum(c * chunk, ku))
        k_hi = torch.where(c < 0, torch.zeros_like(c), torch.minimum((c + 1) * chunk, ku))
    else:
        row = torch.where(c > 0, qu, torch.zeros_like(c))
        k_lo = torch.where(c > 0, ku, torch.zeros_like(c))
        k_hi = torch.where(c < 0, torch.zeros_like(c), ku)
    cu_q = torch.cat([s.q0[seq] + row, torch.tensor([s.q_end])])
    k0 = s.k0[seq]
    max_q = int((cu_q[1:] - cu_q[:-1]).max()) if seq.numel() else 0
    return Plan(cu_q.to(torch.int32), k0 + k_lo, k0 + k_hi, seq, max(max_q, 1))


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


def _first_bad(bad: torch.Tensor) -> int:
    return int(torch.nonzero(bad)[0, 0])


def _prefix_sums(x: Any, name: str, total: int, length: Optional[int] = None) -> torch.Tensor:
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
        b = _first_bad(bad)
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
        cu = _prefix_sums(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
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
        cu = _prefix_sums(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch + 1)
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
              num_splits: int):
    """The plan over packed q against a cache it only reads: paged (``table`` (batch,
    max_blocks)) or contiguous (sequence b reads cache batch ``batch_idx[b]``, default b); the
    plan's keys are cache positions. Forward only. Returns (out (total_q, Hq, Dv), lse (Hq,
    total_q)); tensors off the CPU are computed on CPU copies."""
    check_same_dtype((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    device = q.device
    if table is not None:
        block_table, cache_batch = table.index_select(0, plan.seq).to(torch.int32), None
    else:
        rows = plan.seq if batch_idx is None else batch_idx.index_select(0, plan.seq)
        block_table, cache_batch = None, rows.to(torch.int32)
    if device.type != "cpu":
        q, k_cache, v_cache = q.cpu(), k_cache.cpu(), v_cache.cpu()
    sinks = None if sinks is None else torch.as_tensor(sinks).to(device="cpu",
                                                                 dtype=torch.float32)
    kopts = kernel_options(options, None, sinks)
    out, lse = _cache_ops.call(
        torch.ops.anyattn.fwd_kvcache_varlen, kernel_query(q, options), k_cache, v_cache,
        plan.cu_q, plan.max_q, plan.k_hi.to(torch.int32), -1, cache_batch,
        plan.k_lo.to(torch.int32), block_table, *kopts.score_args(), max(num_splits, 0))
    return out.to(device), lse.to(device)


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


def dense_attention(q, k, v, options: AttnOptions, chunk: int, sinks):
    """(out (B, Sq, Hq, Dv), lse (B, Hq, Sq)) of q (B, Sq, Hq, D) against k/v (B, Sk, Hk, D[v])."""
    if chunk == 0:
        return _lse_of(_fa2_func(q, k, v, softmax_scale=options.softmax_scale,
                                 causal=options.causal, window_size=options.window_size,
                                 softcap=options.softcap, return_attn_probs=True, sinks=sinks))
    check_dense_shapes(q, k, v)
    return varlen_attention(q, k, v, None, None, None, None, None, None, None, options, sinks,
                            chunk, 0)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     seqused_q, seqused_k, page_table, options: AttnOptions, sinks, chunk: int,
                     num_splits: int):
    """FA3/FA4 varlen semantics: q packed with cu_seqlens_q or batched without; k/v packed with
    cu_seqlens_k, batched without, or a paged cache with page_table. Returns (out, lse) in q's
    layout: (total_q, Hq, Dv) and (Hq, total_q), or (B, Sq, Hq, Dv) and (B, Hq, Sq)."""
    if page_table is not None and cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k: must be None with page_table (the key counts come from "
                         "seqused_k, else every sequence has the page_table's full capacity)")
    if (cu_seqlens_q is not None and cu_seqlens_k is not None and page_table is None
            and seqused_q is None and chunk == 0):
        if max_seqlen_q is None or max_seqlen_k is None:
            max_seqlen_q = _max_length(cu_seqlens_q) if max_seqlen_q is None else max_seqlen_q
            max_seqlen_k = _max_length(cu_seqlens_k) if max_seqlen_k is None else max_seqlen_k
        return _lse_of(_fa2_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=options.softmax_scale, causal=options.causal,
            window_size=options.window_size, softcap=options.softcap, return_attn_probs=True,
            sinks=sinks, seqused_k=seqused_k))
    pq, q0, q_used, q_span, q_end = query_extents(q, cu_seqlens_q, seqused_q)
    batch = q0.numel()
    if page_table is not None:
        table = _page_table(page_table, batch, k)
        span = torch.full((batch,), table.shape[1] * k.shape[1], dtype=torch.int64)
        k_used = span if seqused_k is None else _used_counts(seqused_k, "seqused_k", span, "keys")
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


def _max_length(cu: Any) -> int:
    c = index_vector(cu, "cu_seqlens")
    return max(int((c[1:] - c[:-1]).max()), 1) if c.numel() > 1 else 1


def _page_table(page_table: Any, batch: int, k_cache: torch.Tensor) -> torch.Tensor:
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
        cu = _prefix_sums(cu_seqlens_k_new, "cu_seqlens_k_new", k.shape[0], batch + 1)
        counts, k, v = cu[1:] - cu[:-1], k[int(cu[0]):], v[int(cu[0]):]
    for name, new, cache in (("k", k, k_cache), ("v", v, v_cache)):
        if tuple(new.shape[1:]) != tuple(cache.shape[2:]):
            raise ValueError(f"{name}: heads and head dim {tuple(new.shape[1:])} differ from the "
                             f"cache's {tuple(cache.shape[2:])}")
        if new.dtype != cache.dtype:
            raise TypeError(f"{name}: dtype {new.dtype} differs from the cache's {cache.dtype}")
    return counts, k, v


def _positions(counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sequence, index within it) of each of sum(counts) packed items."""
    seq = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    first = torch.cumsum(counts, 0) - counts
    return seq, torch.arange(seq.numel()) - first[seq]


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
                    rotary, rotary_base):
    """Write the packed new keys/values of sequence b at cache positions stored[b] + t, in place,
    rotating keys first when ``rotary`` = (cos, sin, interleaved) is given (positions
    rotary_base[b] + t). ``table``: paged cache rows; else ``batch_idx`` picks cache batches."""
    seq, t = _positions(counts)
    pos = stored[seq] + t
    if table is not None:
        page, num_blocks = k_cache.shape[1], k_cache.shape[0]
        blocks = table[seq, pos // page]
        bad = (blocks < 0) | (blocks >= num_blocks)
        if bool(bad.any()):
            i = _first_bad(bad)
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
            k_new = rotate(k_new, c, s, interleaved)
        device = k_cache.device
        k_cache[blocks.to(device), rows.to(device)] = k_new
        v_cache[blocks.to(device), rows.to(device)] = v_new.detach()


def _cache_geometry(k_cache, v_cache, page_table, cache_batch_idx, batch: int):
    """(table or None, batch_idx or None, capacity per sequence) of a paged or contiguous cache."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions (batch_cache or num_blocks, seqlen "
                             f"or page_block_size, nheads_k, headdim), got {tuple(cache.shape)}")
    if page_table is not None:
        table = _page_table(page_table, batch, k_cache)
        return table, None, table.shape[1] * k_cache.shape[1]
    if cache_batch_idx is None:
        if k_cache.shape[0] < batch:
            raise ValueError(f"k_cache: {k_cache.shape[0]} cache batches for {batch} sequences; "
                             "pass cache_batch_idx, or a cache with a batch per sequence")
        return None, None, k_cache.shape[1]
    idx = index_vector(cache_batch_idx, "cache_batch_idx", batch)
    bad = (idx < 0) | (idx >= k_cache.shape[0])
    if bool(bad.any()):
        b = _first_bad(bad)
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
                    num_splits: int):
    """flash_attn_with_kvcache for what anyattn's own call lacks (packed q with cu_seqlens_q,
    packed new keys with cu_seqlens_k_new, rotary_seqlens, attention_chunk): the append (and its
    rotary) in torch, then one read-only varlen cache call. Returns (out, lse) in q's layout."""
    pq, q0, q_used, q_span, q_end = query_extents(q, cu_seqlens_q, None)
    batch = q0.numel()
    table, batch_idx, capacity = _cache_geometry(k_cache, v_cache, page_table, cache_batch_idx,
                                                 batch)
    counts, k_new, v_new = _new_tokens(k, v, cu_seqlens_k_new if k is not None else None, batch,
                                       k_cache, v_cache)
    stored = _stored_lengths(cache_seqlens, batch, capacity, counts)
    pad = (torch.zeros_like(stored) if cache_leftpad is None
           else index_vector(cache_leftpad, "cache_leftpad", batch))
    bad = (stored < 0) | (stored + counts > capacity)
    if bool(bad.any()):
        b = _first_bad(bad)
        raise ValueError(f"cache_seqlens: sequence {b} holds {int(stored[b])} keys and appends "
                         f"{int(counts[b])}; supported: 0 .. {capacity} keys in all")
    bad = (pad < 0) | (pad > stored)
    if bool(bad.any()):
        b = _first_bad(bad)
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
                        torch.arange(batch) if batch_idx is None else batch_idx, rotary, base)
    if rotary is not None:
        pq = _rotate_queries(pq, q0, q_span, q_end, base, rotary,
                             options.causal or options.has_window() or chunk > 0)
    seqs = Seqs(q0, q_used, q_span, pad, stored + counts - pad, q_end, 0)
    out, lse = run_cache(pq, k_cache, v_cache, plan_subsequences(seqs, chunk), table, batch_idx,
                         options, sinks, num_splits)
    return unpack(out, lse, q, cu_seqlens_q is None)


def _rotate_queries(pq, q0, q_span, q_end, base, rotary, per_row: bool):
    """Packed q with sequence b's rows rotated at base[b] + i (``per_row``) or all at base[b]."""
    cos, sin, interleaved = rotary
    seq, i = _positions(q_span)
    pos = base[seq] + (i if per_row else torch.zeros_like(i))
    c, s = _rotary_rows(cos, sin, pos, pq.shape[-1])
    start = int(q0[0]) if q0.numel() else 0
    rotated = rotate(pq[start:q_end], c, s, interleaved)
    return torch.cat([pq[:start], rotated, pq[q_end:]])


def empty_accumulators(out: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """FA3's (out_accum, softmax_lse_accum) when no split partials are kept: empty tensors."""
    return (torch.empty((0,), dtype=torch.float32, device=out.device),
            torch.empty((0,), dtype=torch.float32, device=out.device))


# ---- Combining split partials -----------------------------------------------------------------


def combine_partials(out_partial: torch.Tensor, lse_partial: torch.Tensor, out_dtype):
    """Merge num_splits partial results over disjoint keys.

    out_partial (num_splits, ..., H, D), lse_partial (num_splits, ..., H) natural log (-inf =
    empty split). Returns (out (..., H, D) in ``out_dtype``, lse (..., H) float32); rows whose
    splits are all empty give out 0 and lse -inf. Computed in float32.
    """
    if not isinstance(out_partial, torch.Tensor) or out_partial.dim() not in (4, 5):
        raise ValueError("out_partial: expected (num_splits, batch, seqlen, nheads, headdim) or "
                         f"(num_splits, total_q, nheads, headdim), got {_describe(out_partial)}")
    if not isinstance(lse_partial, torch.Tensor) or (
            tuple(lse_partial.shape) != tuple(out_partial.shape[:-1])):
        raise ValueError(f"lse_partial: expected shape {tuple(out_partial.shape[:-1])} "
                         f"(out_partial's without headdim), got {_describe(lse_partial)}")
    lse_parts = lse_partial.to(torch.float32)
    lse = torch.logsumexp(lse_parts, dim=0)
    weight = torch.exp(lse_parts - lse.unsqueeze(0))
    weight = torch.where(torch.isfinite(weight), weight, torch.zeros_like(weight))
    out = (weight.unsqueeze(-1) * out_partial.to(torch.float32)).sum(0)
    return out.to(out_partial.dtype if out_dtype is None else out_dtype), lse


# ---- FA3's public functions -------------------------------------------------------------------


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
):
    """flash_attn_func on packed qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen,
    nheads_q + 2 * nheads_k, headdim) with ``num_heads_q`` (GQA). q, k and v are views of qkv
    (gradients reach qkv). Other arguments, raises and returns as in flash_attn_func.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv: expected a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5 and qkv.shape[2] == 3:
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(f"num_heads_q: required with a 4-D qkv {tuple(qkv.shape)} (batch, "
                             "seqlen, nheads_q + 2 * nheads_k, headdim)")
        hq = as_int(num_heads_q, "num_heads_q", minimum=1)
        hk = (qkv.shape[2] - hq) // 2
        if hk < 1 or hq + 2 * hk != qkv.shape[2]:
            raise ValueError(f"num_heads_q: {hq} does not split qkv's {qkv.shape[2]} heads into "
                             "nheads_q + 2 * nheads_k")
        q, k, v = qkv.split([hq, hk, hk], dim=2)
    else:
        raise ValueError(f"qkv: expected (batch, seqlen, 3, nheads, headdim), or 4-D with "
                         f"num_heads_q, got shape {tuple(qkv.shape)}")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale,
                           window_size, attention_chunk, softcap, 1, None, deterministic,
                           sm_margin, return_attn_probs, sinks=sinks,
                           learnable_sink=learnable_sink)


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
):
    """Exact attention, FlashAttention 3 call style.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim);
            v: (batch, seqlen_k, nheads_k, headdim_v). torch float32/float16/bfloat16;
            nheads % nheads_k == 0 (GQA/MQA).
        softmax_scale: None = 1/sqrt(headdim). causal: bottom-right aligned.
        window_size: (left, right), -1 or None = unbounded.
        attention_chunk: 0 = off; > 0 restricts each query to its diagonal's key chunk (module
            docstring).
        softcap: > 0 applies softcap * tanh(scores / softcap).
        num_splits, pack_gqa, deterministic, sm_margin: accepted performance hints.
        sinks / learnable_sink (keyword-only): (nheads,) sink logits; they get gradients.
        qv, q_descale, k_descale, v_descale: raise NotImplementedError unless None.
    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype, or with return_attn_probs
        (out, softmax_lse (batch, nheads, seqlen_q) float32).
    Autograd: q, k, v and the sinks get gradients, also with attention_chunk (FA3 has none
    there).
    Raises:
        TypeError / ValueError naming the argument for bad input.
    """
    reject_unsupported(qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(num_splits=num_splits, sm_margin=sm_margin)
    options = fa3_options(softmax_scale, causal, window_size, softcap, deterministic)
    out, lse = dense_attention(q, k, v, options, chunk_size(attention_chunk),
                               pick_sinks(sinks, learnable_sink))
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
    return_softmax_lse=False,
):
    """Attention over packed sequences of different lengths, FlashAttention 3 call style.

    Arguments:
        q: (total_q, nheads, headdim) with cu_seqlens_q (batch + 1,) int32 prefix sums, or
            (batch, seqlen_q, nheads, headdim) with cu_seqlens_q None.
        k, v: (total_k, nheads_k, headdim[_v]) with cu_seqlens_k, or batched with it None.
        max_seqlen_q, max_seqlen_k: bounds on the lengths (computed when None).
        seqused_q: (batch,) int32: sequence b computes its first seqused_q[b] queries (aligned as
            a sequence of that length); its other rows are 0 in out, -inf in the LSE.
        seqused_k: (batch,) int32: sequence b attends its first seqused_k[b] keys.
        Other arguments as in flash_attn_func; ``return_softmax_lse`` (keyword-only, sgl-kernel's
        name) is a synonym of return_attn_probs.
    Returns:
        out (total_q, nheads, headdim_v) (batched like q without cu_seqlens_q), or with
        return_attn_probs (out, softmax_lse (nheads, total_q) float32; (batch, nheads, seqlen_q)
        for batched q).
    Autograd: q, k, v and sinks get gradients.
    Raises:
        NotImplementedError for qv and the descale tensors; ValueError naming the argument for
        inconsistent cu_seqlens / seqused / shapes.
    """
    reject_unsupported(qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(num_splits=num_splits, sm_margin=sm_margin)
    options = fa3_options(softmax_scale, causal, window_size, softcap, deterministic)
    out, lse = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                seqused_q, seqused_k, None, options,
                                pick_sinks(sinks, learnable_sink), chunk_size(attention_chunk),
                                0)
    return (out, lse) if (return_attn_probs or return_softmax_lse) else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Combine split-KV partial results (FA3's fwd_combine).

    Arguments:
        out_partial: (num_splits, batch, seqlen, nheads, headdim) (or (num_splits, total_q,
            nheads, headdim)), usually float32.
        lse_partial: (num_splits, batch, seqlen, nheads) float32 natural-log LSEs, -inf for an
            empty split.
        out: optional preallocated (batch, seqlen, nheads, headdim), written and returned.
        out_dtype: dtype of out; None = out_partial's.
    Returns:
        (out, softmax_lse (batch, seqlen, nheads) float32). Rows whose splits are all empty give
        out 0 and LSE -inf.
    """
    result, lse = combine_partials(out_partial, lse_partial, out_dtype)
    if out is not None:
        if tuple(out.shape) != tuple(result.shape):
            raise ValueError(f"out: expected shape {tuple(result.shape)}, got "
                             f"{tuple(out.shape)}")
        out.copy_(result)
        result = out
    return result, lse


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    *,
    sinks=None,
    learnable_sink=None,
):
    """Attention of q against a KV cache, with optional in-place append, FA3 call style.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), or packed (total_q, nheads, headdim) with
            cu_seqlens_q (batch + 1,) (max_seqlen_q is then a hint).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or paged
            (num_blocks, page_block_size, nheads_k, headdim[_v]) with page_table (batch,
            max_blocks) int32; any page size.
        k, v: optional new keys/values, (batch, seqlen_new, nheads_k, headdim[_v]) or packed
            (total_new, ...) with cu_seqlens_k_new; written into the caches in place at
            positions cache_seqlens[b] + t (rotated by rotary_cos/sin first when given) before
            attention. cu_seqlens_k_new is ignored without k (as FA3 does).
        cache_seqlens: int or (batch,) int32: keys already in the cache (None = full after the
            append). cache_batch_idx: (batch,) cache batch of each sequence (contiguous cache).
        cache_leftpad: (batch,) first cache position of each sequence's keys.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2); rotary_interleaved selects GPT-J or
            GPT-NeoX pairs. Positions start at rotary_seqlens[b] when given, else cache_seqlens[b];
            q rows are rotated at start + i when causal, windowed or chunked, else at start.
        softmax_scale, causal, window_size, attention_chunk, softcap, sinks / learnable_sink:
            as in flash_attn_func, aligned to each sequence's keys cache_leftpad[b] ..
            cache_seqlens[b] + seqlen_new - 1.
        scheduler_metadata, num_splits, pack_gqa, sm_margin: accepted performance hints.
        qv, q_descale, k_descale, v_descale: raise NotImplementedError unless None.
    Returns:
        out (batch, seqlen_q, nheads, headdim_v) (or (total_q, ...) for packed q); with
        return_softmax_lse, FA3's 4-tuple (out, softmax_lse (batch, nheads, seqlen_q) or
        (nheads, total_q) float32, out_accum, softmax_lse_accum), the last two empty tensors.
    Autograd: none (an inference path); a backward through it raises NotImplementedError.
    Raises:
        ValueError naming the argument for indices out of range (checked before any write).
    """
    reject_unsupported(qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    check_hints(num_splits=num_splits, sm_margin=sm_margin, max_seqlen_q=max_seqlen_q)
    options = fa3_options(softmax_scale, causal, window_size, softcap, False)
    chunk = chunk_size(attention_chunk)
    sinks = pick_sinks(sinks, learnable_sink)
    splits = max(as_int(num_splits, "num_splits"), 0)
    if (cu_seqlens_q is None and chunk == 0 and rotary_seqlens is None
            and (k is None or cu_seqlens_k_new is None)):
        out, lse = _fa2_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, page_table, softmax_scale=options.softmax_scale,
            causal=options.causal, window_size=options.window_size, softcap=options.softcap,
            rotary_interleaved=rotary_interleaved, num_splits=splits, return_softmax_lse=True,
            sinks=sinks)
    else:
        out, lse = kvcache_general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                   cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
                                   cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, options,
                                   rotary_interleaved, chunk, sinks, splits)
    if return_softmax_lse:
        return (out, lse) + empty_accumulators(out)
    return out


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: torch.Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3's scheduler precomputation, which anyattn does not need.

    Returns an empty int32 tensor on cache_seqlens' device: flash_attn_with_kvcache accepts it as
    scheduler_metadata and ignores it (anyattn plans each call itself). The arguments are
    accepted as FA3 names them and not used.
    """
    device = cache_seqlens.device if isinstance(cache_seqlens, torch.Tensor) else "cpu"
    return torch.empty((0,), dtype=torch.int32, device=device)
