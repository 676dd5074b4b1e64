"""FlashAttention 4's ``gather_kv_indices``: top-k sparse attention, in which each query row
attends only the keys its own index row names (DeepSeek V3.2's sparse absorbed MLA, where an
indexer picks 2048 of a sequence's latent rows per token).

Semantics (FA4's ``flash_attn/cute`` kernels): query row m of sequence b (m below its query count
Sq_b) attends key k0_b + idx for every slot idx of its index row with 0 <= idx < limit, where k0_b
is the sequence's first key row and the limit is its key count Sk_b, or under causal m + 1 + Sk_b
- Sq_b (bottom-right). A window bounds the slots the same way (FA4 takes none with qv). Any other
slot counts for nothing (FA4's callers mark empty slots -1), and a key named twice counts twice,
as FA4 gathers it twice. A row without a valid slot gives out 0 and lse -inf (with a sink: out 0
and the sink's logit).

With a paged cache (page_table, which FA4 does not take with gather_kv_indices) positions are
those of the paged sequence.

How it runs: every query row becomes a one-row sequence of one paged varlen call whose pages
hold one key each: k and v are viewed in place as (rows, 1, nheads_k, headdim) caches, the row's
valid slots (as key rows, in the order given) are its block table and their count its key count.
The masks were applied in choosing the slots, so the call runs without them, in one C function
when it is plain (_fa_plan.plain_cache_call). The kernel reads each selected row once per kv
head, as FA4's gather does.

Gradients (FA4 has a sparse backward too): when autograd records the call, the selected rows are
copied out (index_select) into one packed varlen call with a sequence per query row, whose
backward is anyattn's; the copies' gradients are summed back into k and v. That route runs in
float32 and costs float32 copies of k, v and every selected row, which the other avoids.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
import torch

from ._cache_ops import records_grad
from ._fa_arguments import describe_value
from ._fa_plan import (Plan, first_true_index, index_vector, paged_keys, plain_cache_call,
                       prefix_sums, query_extents, run_cache, unpack)
from ._options import AttnOptions
from ._segments import segment_positions_np
from .varlen import flash_attn_varlen_func as _fa2_varlen_func


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: Any,
                       cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_q: Any, seqused_k: Any,
                       page_table: Any, options: AttnOptions,
                       sinks: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k sparse attention of q against the k/v rows ``indices`` selects (module docstring).

    Arguments:
        q: (total_q, Hq, D) packed with cu_seqlens_q (batch + 1,), or (batch, seqlen_q, Hq, D)
            with cu_seqlens_q None.
        k, v: (total_k, Hk, D[v]) packed with cu_seqlens_k, or (batch, seqlen_k, Hk, D[v]) with
            cu_seqlens_k None. seqused_k[b] keys of sequence b from its first row (from
            cu_seqlens_k[b]; may run past cu_seqlens_k[b + 1], as FA4 addresses them). Or
            paged caches (num_pages, page_size, Hk, D[v]) with page_table (batch, max_blocks)
            and cu_seqlens_k None (FA4 takes no page table with gather_kv_indices): positions
            are then those of the paged sequence.
        indices: integer (total_q, topk) for packed q, (batch, seqlen_q, topk) for batched q;
            positions within the row's sequence, any topk >= 0.
        seqused_q: queries computed per sequence (the rest give out 0 and lse -inf).
        options: scale, causal, window and softcap (FA4's meanings); sinks: (Hq,) logits.
    Returns:
        (out, lse) in q's layout: (total_q, Hq, Dv) and (Hq, total_q), or (batch, seqlen_q, Hq,
        Dv) and (batch, Hq, seqlen_q).
    Raises:
        TypeError / ValueError naming the argument for bad input.
    """
    pq, q0, q_used, _, _ = query_extents(q, cu_seqlens_q, seqused_q)
    batch = q0.numel()
    keys = _keys(k, v, cu_seqlens_k, seqused_k, page_table, batch)
    slots = _index_rows(indices, q, cu_seqlens_q is None)
    rows = _Rows.of(q0.numpy(), q_used.numpy())
    table, counts = _key_table(slots, rows, keys, options)
    total = pq.shape[0]
    unmasked = options._replace(causal=False, window_size=(-1, -1))
    if records_grad(pq, keys.rows_k, keys.rows_v, sinks):
        out, lse = _differentiable(pq, keys, table, counts, unmasked, sinks)
    else:
        pages_k, pages_v = keys.rows_k.unsqueeze(1), keys.rows_v.unsqueeze(1)
        cu_q = torch.arange(total + 1, dtype=torch.int32)
        result = plain_cache_call(pq, pages_k, pages_v, cu_q, counts.to(torch.int32),
                                  table.to(torch.int32), unmasked, sinks, 0, True)
        if result is None:
            plan = Plan(cu_q, torch.zeros(total, dtype=torch.int64), counts, torch.arange(total),
                        1)
            result = run_cache(pq, pages_k, pages_v, plan, table, None, unmasked, sinks, 0)
        out, lse = result
    if sinks is not None:  # rows not computed hold -inf, not the sink's logit
        dead = np.ones(total, dtype=bool)
        dead[rows.packed] = False
        lse = lse.masked_fill(torch.from_numpy(dead).to(lse.device)[None, :], float("-inf"))
    return unpack(out, lse, q, cu_seqlens_q is None)


def _differentiable(pq: torch.Tensor, keys: "_Keys", table: torch.Tensor, counts: torch.Tensor,
                    options: AttnOptions, sinks: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same attention through autograd: each row's keys copied out (index_select) into one
    packed varlen call, one sequence per row. Its backward is anyattn's varlen backward, and the
    copies' gradients are added back into the rows they came from (index_select's backward).
    16-bit inputs run in float32, so that a key's gradient, a sum over every row that selected
    it, is accumulated in float32 and rounded once (as the dense backward does), not once per
    row; out is rounded back to q's dtype."""
    total, topk = table.shape
    chosen = table[torch.arange(topk)[None, :] < counts[:, None]]  # row by row, in slot order
    rows = chosen.to(keys.rows_k.device)
    cu_k = torch.zeros(total + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=cu_k[1:])
    wide = torch.float32
    result = _fa2_varlen_func(
        pq.to(wide), keys.rows_k.to(wide).index_select(0, rows),
        keys.rows_v.to(wide).index_select(0, rows),
        torch.arange(total + 1, dtype=torch.int32, device=pq.device),
        cu_k.to(device=pq.device, dtype=torch.int32), 1, max(int(counts.max()) if total else 0, 1),
        softmax_scale=options.softmax_scale, softcap=options.softcap, return_attn_probs=True,
        sinks=sinks)
    return result[0].to(pq.dtype), result[1]


class _Keys(NamedTuple):
    """Where the keys are: k and v as rows (rows, Hk, D[v]), the keys per sequence (int64), and
    how a sequence's key position maps to a row: ``first[b] + position``, or through the page
    table ``pages`` (batch, max_blocks) of pages of ``page`` rows (int64 numpy arrays)."""

    rows_k: torch.Tensor
    rows_v: torch.Tensor
    used: np.ndarray
    first: Optional[np.ndarray]
    pages: Optional[np.ndarray]
    page: int

    def rows_of(self, seq: np.ndarray, pos: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """The rows of key positions ``pos`` (n, topk) of sequences ``seq`` (n,); only the
        ``valid`` entries are meaningful."""
        if self.pages is None:
            return pos + self.first[seq][:, None]
        pos = np.where(valid, pos, 0)
        blocks = np.take_along_axis(self.pages[seq], pos // self.page, 1)
        num_pages = self.rows_k.shape[0] // self.page
        bad = valid & ((blocks < 0) | (blocks >= num_pages))
        if bad.any():
            r = int(np.flatnonzero(bad.any(1))[0])
            raise ValueError(f"page_table: sequence {int(seq[r])} names page "
                             f"{int(blocks[r][bad[r]][0])}; supported: 0 .. {num_pages - 1}")
        return blocks * self.page + pos % self.page


def _keys(k: torch.Tensor, v: torch.Tensor, cu_seqlens_k: Any, seqused_k: Any,
          page_table: Any, batch: int) -> _Keys:
    """The checked keys of a call (gathered_attention's arguments), as rows."""
    if page_table is not None:
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k: must be None with page_table")
        pages, used = paged_keys(page_table, k, batch, seqused_k)
        if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
            raise ValueError(f"v: expected {tuple(k.shape[:3])} + (headdim_v,) like k, got "
                             f"shape {tuple(v.shape)}")
        n = k.shape[0] * k.shape[1]
        return _Keys(k.reshape(n, k.shape[2], k.shape[3]), v.reshape(n, v.shape[2], v.shape[3]),
                     used.numpy(), None, pages.numpy(), k.shape[1])
    if cu_seqlens_k is None:
        if k.dim() != 4 or k.shape[0] != batch:
            raise ValueError(f"k: expected ({batch}, seqlen_k, nheads_k, headdim) without "
                             f"cu_seqlens_k, got shape {tuple(k.shape)}")
        if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
            raise ValueError(f"v: expected {tuple(k.shape[:3])} + (headdim_v,) like k, got "
                             f"shape {tuple(v.shape)}")
        sk = k.shape[1]
        rows_k = k.reshape(batch * sk, k.shape[2], k.shape[3])
        rows_v = v.reshape(batch * sk, v.shape[2], v.shape[3])
        first = torch.arange(batch, dtype=torch.int64) * sk
        span = room = torch.full((batch,), sk, dtype=torch.int64)
    else:
        if k.dim() != 3 or v.dim() != 3 or v.shape[:2] != k.shape[:2]:
            raise ValueError(f"k, v: expected (total_k, nheads_k, headdim[_v]) with cu_seqlens_k, "
                             f"got shapes {tuple(k.shape)} and {tuple(v.shape)}")
        cu = prefix_sums(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch + 1)
        rows_k, rows_v, first, span = k, v, cu[:-1], cu[1:] - cu[:-1]
        room = k.shape[0] - first
    used = span
    if seqused_k is not None:
        used = index_vector(seqused_k, "seqused_k", batch)
        bad = (used < 0) | (used > room)
        if bool(bad.any()):
            b = first_true_index(bad)
            raise ValueError(f"seqused_k: sequence {b} uses {int(used[b])} keys; supported: 0 .. "
                             f"{int(room[b])} (the rows of k from its first key)")
    return _Keys(rows_k, rows_v, used.numpy(), first.numpy(), None, 1)


def _index_rows(indices: Any, q: torch.Tensor, batched: bool) -> np.ndarray:
    """gather_kv_indices as an int64 array (rows of packed q, topk)."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"gather_kv_indices: expected an integer tensor, got "
                        f"{describe_value(indices)}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(f"gather_kv_indices: expected an integer tensor (int32), got dtype "
                        f"{indices.dtype}")
    lead = tuple(q.shape[:2]) if batched else tuple(q.shape[:1])
    if indices.dim() != len(lead) + 1 or tuple(indices.shape[:-1]) != lead:
        want = "(batch, seqlen_q, topk)" if batched else "(total_q, topk)"
        raise ValueError(f"gather_kv_indices: expected {want} = {lead + ('topk',)} (q's leading "
                         f"dimensions), got shape {tuple(indices.shape)}")
    rows = lead[0] * lead[1] if batched else lead[0]
    return indices.to(device="cpu", dtype=torch.int64).reshape(rows, indices.shape[-1]).numpy()


class _Rows(NamedTuple):
    """The packed rows a call computes, with their sequences: row packed[i] is query pos[i] of
    sequence seq[i] (the first q_used[b] rows of each sequence b, in order; int64 arrays)."""

    packed: np.ndarray
    seq: np.ndarray
    pos: np.ndarray
    q_used: np.ndarray

    @staticmethod
    def of(q0: np.ndarray, q_used: np.ndarray) -> "_Rows":
        seq, pos = segment_positions_np(q_used)
        return _Rows(q0[seq] + pos, seq, pos, q_used)


def _key_table(slots: np.ndarray, rows: _Rows, keys: _Keys,
               options: AttnOptions) -> Tuple[torch.Tensor, torch.Tensor]:
    """(table (total_q, topk) int64, counts (total_q,) int64): the valid slots of each computed
    row as key rows, its first counts[r] entries in the order given, 0 after them; other rows
    have none. numpy: these are a few dozen operations on small arrays, where torch's per-call
    cost would dominate a decode step."""
    total, topk = slots.shape
    table = np.zeros((total, topk), dtype=np.int64)
    counts = np.zeros(total, dtype=np.int64)
    if rows.packed.size and topk:
        seq = rows.seq
        k_used = keys.used[seq]
        diag = (rows.pos + k_used - rows.q_used[seq])[:, None]  # the key aligned with each row
        idx = slots[rows.packed]
        valid = (idx >= 0) & (idx < k_used[:, None])
        left, right = options.effective_window()
        if right >= 0:
            valid &= idx <= diag + right
        if left >= 0:
            valid &= idx >= diag - left
        n_valid = valid.sum(1)
        chosen = keys.rows_of(seq, idx, valid)
        if (valid[:, 1:] & ~valid[:, :-1]).any():  # an invalid slot before a valid one
            chosen = np.take_along_axis(chosen, np.argsort(~valid, axis=1, kind="stable"), 1)
        chosen[np.arange(topk)[None, :] >= n_valid[:, None]] = 0
        table[rows.packed] = chosen
        counts[rows.packed] = n_valid
    return torch.from_numpy(table), torch.from_numpy(counts)
