"""FlashAttention 4's Python API (``flash_attn.cute``, its ``interface`` module) on anyattn.

``flash_attn_func`` and ``flash_attn_varlen_func`` keep FA4's names, positional order (q, k, v,
then ``qv`` and, for the dense call, ``gather_kv_indices`` before ``softmax_scale``), defaults and
return value: always the pair ``(out, lse)``, lse None unless ``return_lse`` or an input requires
grad. ``flash_attn_combine`` is FA4's split-KV combine (exported by ``interface``, not by the
package). They run on CPU torch tensors through anyattn's kernels (other devices go through
anyattn's dispatch), with these meanings:

- ``window_size``: (left, right), None = unbounded. As in FA4, causal sets right = 0, and a pair
  of ints whose sum is negative (FA2's (-1, -1)) means no window; then -1 also reads unbounded.
- ``learnable_sink``: (nheads,) sink logits (any float dtype; FA4 wants bfloat16) joining the
  softmax denominator; the LSE includes them, and they get a gradient.
- ``seqused_q``: sequence b computes only its first seqused_q[b] queries, aligned as a sequence
  of that length; its other rows are 0 in out and -inf in the LSE (FA4 leaves them unwritten).
- ``page_table``: k/v are paged caches (num_pages, page_size, nheads_k, headdim), any page size;
  forward only, as anyattn's paged varlen.
- Hints accepted and unused: ``num_splits``, ``pack_gqa``, ``deterministic`` (anyattn is always
  deterministic), ``min_seqlen_k``.
- ``qv`` (absorbed MLA's value-side query, _fa_qv.py): scores softmax_scale * (q . k + qv . v),
  default scale (headdim + headdim_v) ** -0.5; q (and k) may be None, leaving qv . v (scale
  headdim_v ** -0.5). As in FA4 the LSE then comes heads-last: (batch, seqlen_q, nheads) or
  (total_q, nheads). A paged varlen cache laid out as one row [v | k] is read in place.
- ``gather_kv_indices`` (top-k sparse attention, _fa4_gather.py): each query row attends the
  keys its index row names, masked as FA4 masks them; with any q/k/v (FA4: with qv only) and a
  page_table (FA4: not with it); gradients as FA4's sparse backward gives them.
- GPU-only features raise NotImplementedError naming the parameter when given: ``score_mod``,
  ``score_mod_bwd``, ``mask_mod``, ``aux_tensors``, ``aux_scalars``, block sparsity (and the
  block-sparsity keywords of older FA4 releases).
- float8 q, k and v (``torch.float8_e4m3fn`` / ``float8_e5m2``, as FA4 takes them on SM100,
  with unit descales): attention over their values with P in float32, out bfloat16, forward
  only (_fa3_fp8.py); not with qv or gather_kv_indices.
- The LSE is float32, natural log, and not differentiable (FA4 now back-propagates through a
  returned LSE; here a loss that uses it gets no gradient through it).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._options import AttnOptions, make_options
from ._fa_arguments import as_int, check_hints, reject_unsupported
from ._fa_qv import fa4_query_and_keys
from ._fa3_fp8 import fp8_attention, is_float8
from ._cache_ops import records_grad
from ._fa4_gather import gathered_attention
from ._fa_plan import combine_partials, dense_attention, index_vector, varlen_attention

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]

# FA4 reads its version from the installed "fa4" distribution and falls back to "0.0.0"; this
# stand-in reports that fallback, marked as anyattn's.
__version__ = "0.0.0+anyattn"


def _fa4_window(causal: Any, window_size: Any) -> Tuple[int, int]:
    """FA4's window normalisation, as flash-attn 2.x (left, right) with -1 for unbounded."""
    if window_size is None:
        window_size = (None, None)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair (left, right) of ints or None, got "
                        f"{window_size!r}") from None
    if causal:
        right = 0
    if left is not None and right is not None:
        left, right = as_int(left, "window_size[0]"), as_int(right, "window_size[1]")
        if left + right < 0:
            left = right = None
    return (-1 if left is None else left), (-1 if right is None else right)


def _fa4_options(softmax_scale, causal, window_size, softcap, deterministic) -> AttnOptions:
    return make_options(0.0, softmax_scale, causal, _fa4_window(causal, window_size),
                        0.0 if softcap is None else softcap, deterministic)


def _check_qv(qv: Any, positional_name: str) -> None:
    """qv must be a tensor or None; anything else is most likely a positional argument of an
    older FA4."""
    if qv is not None and not isinstance(qv, torch.Tensor):
        raise TypeError(
            f"qv: expected a tensor or None, got {type(qv).__name__} {qv!r}. FA4 now takes qv "
            f"as its 4th positional argument; a call written for an older FA4, whose 4th was "
            f"{positional_name}, must pass {positional_name} by keyword")


def _qv_lse(lse: Optional[torch.Tensor], qv: Any) -> Optional[torch.Tensor]:
    """With qv FA4 returns the LSE heads-last: (batch, seqlen_q, nheads) or (total_q, nheads)."""
    if lse is None or qv is None:
        return lse
    return lse.transpose(-1, -2).contiguous()


def _wants_lse(return_lse: bool, inputs) -> bool:
    """FA4 returns the LSE when asked for, or when an input requires grad."""
    return bool(return_lse) or any(isinstance(t, torch.Tensor) and t.requires_grad
                                   for t in inputs)


def _float8_call(q: Any, k: Any, v: Any, qv: Any, gather_kv_indices: Any) -> bool:
    """Whether a call has float8 inputs (FA4 takes them on SM100 with unit descales: out is
    bfloat16, forward only); not with qv or gather_kv_indices (NotImplementedError)."""
    if not any(is_float8(x) for x in (q, k, v)):
        return False
    for name, value in (("qv", qv), ("gather_kv_indices", gather_kv_indices)):
        if value is not None:
            raise NotImplementedError(f"{name}: not supported by anyattn with float8 q, k and v; "
                                      f"pass {name}=None or bfloat16 inputs")
    return True


def _lse_result(lse: torch.Tensor, return_lse: bool, inputs) -> Optional[torch.Tensor]:
    """The LSE FA4 returns: ``lse`` when _wants_lse, else None."""
    return lse if _wants_lse(return_lse, inputs) else None


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[Optional[int], Optional[int]] = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    aux_tensors: Optional[list] = None,
    aux_scalars: Optional[tuple] = None,
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    return_lse: bool = False,
    *,
    full_block_cnt=None,
    full_block_idx=None,
    mask_block_cnt=None,
    mask_block_idx=None,
    block_size=None,
):
    """Exact attention, FlashAttention 4 call style.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim);
            v: (batch, seqlen_k, nheads_k, headdim_v); torch float32/float16/bfloat16,
            nheads % nheads_k == 0.
        softmax_scale: None = 1/sqrt(headdim). causal: bottom-right aligned.
        window_size: (left, right), None = unbounded (module docstring for FA4's rules).
        learnable_sink: (nheads,) sink logits. softcap: > 0 applies softcap * tanh(s / softcap).
        num_splits, pack_gqa, deterministic: accepted hints.
        qv: (batch, seqlen_q, nheads, headdim_v) in q's dtype: adds qv . v to the scores
            (absorbed MLA; headdim + headdim_v <= 576); q and k may then be None.
        gather_kv_indices: (batch, seqlen_q, topk) integer key positions per query row
            (_fa4_gather.py: -1 or out of range counts for nothing).
        score_mod, score_mod_bwd, mask_mod, aux_tensors, aux_scalars, block_sparse_tensors,
            block_sparse_tensors_bwd, and the keyword-only block-sparsity names of older FA4
            releases: raise NotImplementedError unless None.
    Returns:
        (out (batch, seqlen_q, nheads, headdim_v) in q's dtype, lse (batch, nheads, seqlen_q)
        float32 or None; with qv, (batch, seqlen_q, nheads)): lse is returned when return_lse
        or an input requires grad.
    Autograd: q, k, v, qv and learnable_sink get gradients (none for float8 inputs); the LSE
    does not back-propagate.
    Raises:
        TypeError / ValueError naming the argument for bad input.
    """
    _check_qv(qv, "softmax_scale")
    reject_unsupported(score_mod=score_mod,
                       score_mod_bwd=score_mod_bwd, mask_mod=mask_mod, aux_tensors=aux_tensors,
                       aux_scalars=aux_scalars, block_sparse_tensors=block_sparse_tensors,
                       block_sparse_tensors_bwd=block_sparse_tensors_bwd,
                       full_block_cnt=full_block_cnt, full_block_idx=full_block_idx,
                       mask_block_cnt=mask_block_cnt, mask_block_idx=mask_block_idx,
                       block_size=block_size)
    check_hints(num_splits=num_splits)
    options = _fa4_options(softmax_scale, causal, window_size, softcap, deterministic)
    inputs = (q, k, v, qv)
    gather = gather_kv_indices is not None
    if _float8_call(q, k, v, qv, gather_kv_indices):
        out, lse = fp8_attention(q, k, v, None, None, None, None, None, options, learnable_sink,
                                 0, 0, None, None, None)
        return out, _lse_result(lse, return_lse, inputs)
    if qv is not None:  # a latent row [v | k] is read in place unless autograd follows it
        q, k = fa4_query_and_keys(q, k, v, qv, paged=gather and not records_grad(*inputs))
    if gather:
        out, lse = gathered_attention(q, k, v, gather_kv_indices, None, None, None, None, None,
                                      options, learnable_sink)
    else:
        out, lse = dense_attention(q, k, v, options, 0, learnable_sink,
                                   _wants_lse(return_lse, inputs))
    return out, _qv_lse(_lse_result(lse, return_lse, inputs), qv)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    min_seqlen_k: Optional[int] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    gather_kv_indices: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[Optional[int], Optional[int]] = (None, None),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    block_sparse_tensors=None,
    aux_tensors: Optional[list] = None,
    aux_scalars: Optional[tuple] = None,
    return_lse: bool = False,
    *,
    cu_total_m_blocks=None,
    cu_total_n_blocks=None,
):
    """Variable-length (or paged) attention, FlashAttention 4 call style.

    Arguments:
        q: (total_q, nheads, headdim) with cu_seqlens_q (batch + 1,) int32 prefix sums, or
            (batch, seqlen_q, nheads, headdim) with cu_seqlens_q None.
        k, v: (total_k, nheads_k, headdim[_v]) with cu_seqlens_k; (batch, seqlen_k, ...)
            without; or paged (num_pages, page_size, nheads_k, headdim[_v]) with page_table
            (batch, max_pages) int32 (cu_seqlens_k must then be None).
        max_seqlen_q, max_seqlen_k: bounds on the lengths (computed when None); min_seqlen_k: a
            hint.
        seqused_q: (batch,) int32 queries computed per sequence (module docstring).
        seqused_k: (batch,) int32 keys per sequence; with page_table and no seqused_k every
            sequence has page_table.shape[1] * page_size keys.
        qv: (total_q, nheads, headdim_v) (batched like q), as in flash_attn_func; with
            page_table, k and v laid out as one row [v | k] (v = cache[..., :headdim_v],
            k = cache[..., headdim_v:]) are read in place, other layouts gathered.
        gather_kv_indices: (total_q, topk), or (batch, seqlen_q, topk) for batched q, integer
            key positions per query row within its sequence (with page_table: its paged
            sequence); seqused_k may then run past the next cu_seqlens_k entry.
        Other arguments as in flash_attn_func; ``cu_total_m_blocks``/``cu_total_n_blocks``
        (keyword-only, older FA4 block sparsity) raise NotImplementedError unless None.
    Returns:
        (out (total_q, nheads, headdim_v), lse (nheads, total_q) float32 or None); batched q
        gives (batch, seqlen_q, nheads, headdim_v) and (batch, nheads, seqlen_q). With qv the
        lse is heads-last, (total_q, nheads) or (batch, seqlen_q, nheads). lse is returned when
        return_lse or an input requires grad.
    Autograd: q, k, v, qv and learnable_sink get gradients, except with float8 inputs, or with
    page_table and no gather_kv_indices: those calls are forward only (backward raises
    NotImplementedError).
    Raises:
        TypeError / ValueError naming the argument for bad input.
    """
    _check_qv(qv, "cu_seqlens_q")
    reject_unsupported(score_mod=score_mod,
                       score_mod_bwd=score_mod_bwd, mask_mod=mask_mod,
                       block_sparse_tensors=block_sparse_tensors, aux_tensors=aux_tensors,
                       aux_scalars=aux_scalars, cu_total_m_blocks=cu_total_m_blocks,
                       cu_total_n_blocks=cu_total_n_blocks)
    check_hints(num_splits=num_splits, min_seqlen_k=min_seqlen_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k)
    options = _fa4_options(softmax_scale, causal, window_size, softcap, deterministic)
    inputs = (q, k, v, qv)
    gather = gather_kv_indices is not None
    # num_splits (FA4's default 1: do not split) schedules FA4's GPU kernels; every call below
    # passes 0, letting anyattn's plan split each call's keys for the CPU's threads.
    if _float8_call(q, k, v, qv, gather_kv_indices):
        out, lse = fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                 page_table, options, learnable_sink, 0, 0, None, None, None)
        return out, _lse_result(lse, return_lse, inputs)
    if qv is not None:
        # a latent row [v | k] is read in place, unless autograd follows a gather through it
        paged = not records_grad(*inputs) if gather else page_table is not None
        q, k = fa4_query_and_keys(q, k, v, qv, paged=paged)
    if gather:
        out, lse = gathered_attention(q, k, v, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                      seqused_q, seqused_k, page_table, options, learnable_sink)
    else:
        out, lse = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, seqused_q, seqused_k, page_table, options,
                                    learnable_sink, 0, 0, _wants_lse(return_lse, inputs))
    return out, _qv_lse(_lse_result(lse, return_lse, inputs), qv)


def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    seqused: Optional[torch.Tensor] = None,
    varlen_batch_idx: Optional[torch.Tensor] = None,
    return_lse: bool = True,
):
    """Combine split-KV partial results, FlashAttention 4's ``interface.flash_attn_combine``.

    Arguments:
        out_partial: (num_splits, batch, seqlen, nheads, headdim), or packed (num_splits,
            total_q, nheads, headdim).
        lse_partial: (num_splits, batch, seqlen, nheads) or (num_splits, total_q, nheads)
            float32 natural-log LSEs, -inf for an empty split.
        out: optional preallocated output, written and returned. out_dtype: None = out_partial's.
        cu_seqlens: (batch + 1,) for the packed layout: rows outside [cu_seqlens[0],
            cu_seqlens[-1]) are 0 / -inf. seqused: (batch,) for the batched layout: rows
            s >= seqused[b] of batch b are 0 / -inf.
        varlen_batch_idx: raises NotImplementedError unless None.
    Returns:
        (out (batch, seqlen, nheads, headdim) or (total_q, nheads, headdim), lse (batch, seqlen,
        nheads) or (total_q, nheads) float32, or None without return_lse).
    """
    reject_unsupported(varlen_batch_idx=varlen_batch_idx)
    result, lse = combine_partials(out_partial, lse_partial, out_dtype)
    keep = _rows_kept(result, cu_seqlens, seqused)
    if keep is not None:
        result = result.masked_fill(~keep[..., None, None].to(result.device), 0)
        lse = lse.masked_fill(~keep[..., None].to(lse.device), float("-inf"))
    if out is not None:
        if tuple(out.shape) != tuple(result.shape):
            raise ValueError(f"out: expected shape {tuple(result.shape)}, got "
                             f"{tuple(out.shape)}")
        out.copy_(result)
        result = out
    return result, (lse if return_lse else None)


def _rows_kept(result: torch.Tensor, cu_seqlens: Any, seqused: Any) -> Optional[torch.Tensor]:
    """Bool mask over the rows of ``result`` ((batch, seqlen) or (total_q,)) that the combine
    writes, or None when every row is written."""
    packed = result.dim() == 3
    keep = None
    if cu_seqlens is not None:
        if not packed:
            raise ValueError("cu_seqlens: only for the packed layout (num_splits, total_q, "
                             "nheads, headdim)")
        cu = index_vector(cu_seqlens, "cu_seqlens")
        rows = torch.arange(result.shape[0])
        keep = (rows >= cu[0]) & (rows < cu[-1])
    if seqused is not None:
        if packed:
            raise ValueError("seqused: only for the batched layout (num_splits, batch, seqlen, "
                             "nheads, headdim)")
        used = index_vector(seqused, "seqused", result.shape[0])
        keep = torch.arange(result.shape[1])[None, :] < used[:, None]
    return keep
