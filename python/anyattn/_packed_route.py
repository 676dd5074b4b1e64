"""Packed sequences (varlen, paged varlen) on devices without anyattn kernels: one call per call.

With the flash_attn package able to serve the call, its own varlen function runs it. Otherwise
the packed rows run as a single attention over all of them under a block-diagonal mask: query
row r of sequence b sees key row c of the same sequence where the contract's bottom-right
window, measured within the sequence, allows it (docs/varlen_kvcache.md). torch SDPA runs it when
it can express the call and no LSE is wanted, else the f32 math path of _sdpa. The mask is built
from the cumulative lengths on the device, with no host synchronisation and no Python loop over
sequences; it costs total_q x total_k booleans (and, with ALiBi, a bias per query chunk).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _dispatch, _sdpa
from ._options import AttnOptions


class PackedLayout(NamedTuple):
    """Where each packed row sits: its sequence and its position within it, for queries and keys.

    Rows outside every sequence have ``*_valid`` False. ``seqlen_q``/``seqlen_k`` are the
    per-sequence lengths (batch,), seqlen_k counting only the keys in use.
    """

    q_seq: torch.Tensor
    q_pos: torch.Tensor
    q_valid: torch.Tensor
    k_seq: torch.Tensor
    k_pos: torch.Tensor
    k_valid: torch.Tensor
    seqlen_q: torch.Tensor
    seqlen_k: torch.Tensor


def _rows(cu_seqlens: torch.Tensor, total: int, device):
    """(sequence, position, inside) of each of ``total`` packed rows."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    batch = cu.numel() - 1
    rows = torch.arange(total, device=device)
    sequence = torch.searchsorted(cu[1:].contiguous(), rows, right=True)
    inside = (sequence < batch) & (rows >= cu[0])
    sequence = sequence.clamp(max=max(batch - 1, 0))
    return sequence, rows - cu[sequence], inside


def packed_layout(cu_seqlens_q, cu_seqlens_k, seqused_k, total_q: int, total_k: int,
                  device) -> PackedLayout:
    """The PackedLayout of a varlen call (cu_seqlens int tensors, seqused_k optional)."""
    q_seq, q_pos, q_valid = _rows(cu_seqlens_q, total_q, device)
    k_seq, k_pos, k_valid = _rows(cu_seqlens_k, total_k, device)
    cu_q = cu_seqlens_q.to(device=device, dtype=torch.int64)
    cu_k = cu_seqlens_k.to(device=device, dtype=torch.int64)
    seqlen_q, seqlen_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    if seqused_k is not None:
        seqlen_k = torch.minimum(seqlen_k, seqused_k.to(device=device, dtype=torch.int64))
    if seqlen_k.numel():
        k_valid = k_valid & (k_pos < seqlen_k[k_seq])
    return PackedLayout(q_seq, q_pos, q_valid, k_seq, k_pos, k_valid, seqlen_q, seqlen_k)


def _diagonal(layout: PackedLayout, lo: int, hi: int) -> torch.Tensor:
    """(hi - lo, 1): the key position query rows lo..hi-1 align with (bottom-right, per sequence)."""
    seq = layout.q_seq[lo:hi]
    return (layout.q_pos[lo:hi] + layout.seqlen_k[seq] - layout.seqlen_q[seq])[:, None]


def visible_rows(layout: PackedLayout, window, lo: int, hi: int) -> torch.Tensor:
    """(hi - lo, total_k) bool: key row c is visible to query row r (same sequence, in the window)."""
    left, right = window
    ok = (layout.q_seq[lo:hi, None] == layout.k_seq[None, :]) & layout.k_valid[None, :]
    ok &= layout.q_valid[lo:hi, None]
    diag = _diagonal(layout, lo, hi)
    if left >= 0:
        ok &= layout.k_pos[None, :] >= diag - left
    if right >= 0:
        ok &= layout.k_pos[None, :] <= diag + right
    return ok


def alibi_rows(layout: PackedLayout, slopes: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """(1, Hq, hi - lo, total_k) f32 ALiBi bias; slopes (Hq,) or (batch, Hq)."""
    distance = (_diagonal(layout, lo, hi) - layout.k_pos[None, :]).abs().to(torch.float32)
    slopes = slopes.to(torch.float32)
    per_row = slopes[layout.q_seq[lo:hi]] if slopes.dim() == 2 else slopes[None, :]
    return -(per_row.transpose(0, 1)[:, :, None] * distance[None])[None]


def packed_attention(q, k, v, layout: PackedLayout, options: AttnOptions, alibi_slopes, sinks,
                     want_lse: bool):
    """One attention over packed rows q (total_q, Hq, D), k/v (total_k, Hk, D[v]) under the
    block-diagonal mask: (out (total_q, Hq, Dv), lse (Hq, total_q) or None). Rows outside every
    sequence, and queries that see nothing, get out 0 and lse -inf."""
    if layout.seqlen_q.numel() == 0:  # no sequences: every row is outside
        out = q.new_zeros((q.shape[0], q.shape[1], v.shape[-1]))
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
        return out, lse if want_lse else None
    window = options.effective_window()
    why_math = _sdpa.needs_math(options, q.dtype, alibi_slopes is not None, sinks is not None,
                                want_lse)
    if why_math is None and alibi_slopes is None and sinks is None:
        allowed = visible_rows(layout, window, 0, q.shape[0])
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], _repeat_heads(k, q)[None], _repeat_heads(v, q)[None],
            attn_mask=allowed, dropout_p=options.dropout_p, scale=options.softmax_scale)
        out = out[0].transpose(0, 1).masked_fill(~allowed.any(dim=1)[:, None, None], 0.0)
        return out.contiguous(), None
    def alibi(lo, hi):
        return alibi_rows(layout, alibi_slopes, lo, hi)

    bias = None if alibi_slopes is None else alibi
    out, lse = _sdpa.masked_math_attention(
        q[None], k[None], v[None], options, sinks,
        lambda lo, hi: visible_rows(layout, window, lo, hi), bias)
    outside = ~layout.q_valid  # a sink would otherwise give rows outside every sequence an LSE
    out = out[0].masked_fill(outside[:, None, None], 0.0)
    return out, lse[0].masked_fill(outside[None, :], float("-inf"))


def _repeat_heads(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(total, Hk, D) -> (Hq, total, D), each kv head repeated for its query-head group."""
    groups = q.shape[1] // x.shape[1]
    x = x.transpose(0, 1)
    return x.repeat_interleave(groups, dim=0) if groups > 1 else x


def flash_attn_varlen_choice(q, v, options: AttnOptions, alibi_slopes, sinks, seqused_k,
                             want_lse: bool) -> _dispatch.Choice:
    """The backend for a varlen call on q's (non-CPU) device: _dispatch's rules, plus the one
    thing flash_attn's public varlen function lacks (seqused_k)."""
    call = _dispatch.CallFeatures(
        dtype=str(q.dtype).replace("torch.", ""), head_dim=q.shape[-1], head_dim_v=v.shape[-1],
        dropout=options.dropout_p > 0.0, softcap=options.softcap > 0.0,
        alibi=alibi_slopes is not None, window=options.has_window(), sinks=sinks is not None,
        return_lse=want_lse, seqused_k=seqused_k is not None)
    choice = _dispatch.select_backend(q.device.type, call, _dispatch.probe_environment(q.device))
    _dispatch.log_fallback_once(q.device.type, choice)
    return choice


def varlen_on_device(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q: int,
                     max_seqlen_k: int, options: AttnOptions, alibi_slopes, sinks,
                     want_lse: bool = True):
    """A varlen call on torch tensors off the CPU: (out (total_q, Hq, Dv), lse (Hq, total_q) or
    None when not wanted and the backend gives none)."""
    choice = flash_attn_varlen_choice(q, v, options, alibi_slopes, sinks, seqused_k, want_lse)
    if choice.backend == _dispatch.FLASH_ATTN:
        from flash_attn import flash_attn_varlen_func  # noqa: PLC0415 - optional dependency

        from ._flash_attn_compat import original_function  # noqa: PLC0415

        out, lse, _ = original_function(flash_attn_varlen_func)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            dropout_p=options.dropout_p, softmax_scale=options.softmax_scale,
            causal=options.causal, window_size=options.window_size, softcap=options.softcap,
            alibi_slopes=alibi_slopes, deterministic=options.deterministic,
            return_attn_probs=True)
        return out, lse
    layout = packed_layout(cu_seqlens_q, cu_seqlens_k, seqused_k, q.shape[0], k.shape[0],
                           q.device)
    return packed_attention(q, k, v, layout, options, alibi_slopes, sinks, want_lse)
