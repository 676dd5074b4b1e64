"""Attention dropout for torch tensors on CPU: where the seed comes from, and the dropout pattern
that ``return_attn_probs=True`` returns.

The C library's keep mask is a pure function of (seed, offset, b, h, i, j) (docs/backward.md). The
seed and offset are drawn here from torch's default CPU generator, so ``torch.manual_seed(s)``
makes a run reproducible, as it does for flash-attn on CUDA. Each call with ``dropout_p > 0`` draws
a fresh (seed, offset) and keeps it in an int64 tensor ``rng_state`` (2,) that travels with the op
to its backward.

Import this module only when torch is installed.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._segments import segment_positions

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
# Keys per one-hot forward in dropout_pattern (the C ABI's largest Dv).
_CHUNK = 256


def draw_rng_state() -> torch.Tensor:
    """A fresh int64 tensor (2,) = (seed, offset), drawn from torch's default CPU generator.

    Advances the default generator, like any torch random op; reinterpreted as two uint64 values
    by the C ABI call.
    """
    return torch.randint(_I64_MIN, _I64_MAX, (2,), dtype=torch.int64)


def _one_hot_keys(b: int, sk: int, hk: int, j0: int, width: int, dtype) -> torch.Tensor:
    """(b, sk, hk, width) in ``dtype``: 1 at [.., j0 + t, .., t], 0 elsewhere."""
    v = torch.zeros((b, sk, hk, width), dtype=dtype)
    idx = torch.arange(width)
    v[:, j0 + idx, :, idx] = 1
    return v


def _probs_times(q, k, score_args, dropout_p: float, rng_state) -> torch.Tensor:
    """(B, Hq, Sq, Sk): P_ij * Z_ij from forwards on one-hot values (Z = 1 without dropout)."""
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    cols = []
    for j0 in range(0, sk, _CHUNK):
        width = min(_CHUNK, sk - j0)
        v = _one_hot_keys(b, sk, hk, j0, width, q.dtype)
        out, _ = torch.ops.anyattn.fwd(q, k, v, *score_args, dropout_p, rng_state)
        cols.append(out)
    if not cols:
        return q.new_zeros((b, hq, sq, 0))
    return torch.cat(cols, dim=-1).permute(0, 2, 1, 3)


def keep_mask(b: int, sq: int, hq: int, sk: int, dropout_p: float,
              rng_state: torch.Tensor) -> torch.Tensor:
    """(B, Hq, Sq, Sk) bool: True where the C library keeps probability (b, h, i, j).

    Read back from the library itself: with q = k = 0 and no mask every probability is 1/Sk > 0,
    so a forward on one-hot values is nonzero exactly at the kept entries. The mask does not
    depend on the scores, so this is the mask of any call with the same shape and rng_state.
    """
    zeros_q = torch.zeros((b, sq, hq, 1), dtype=torch.float32)
    zeros_k = torch.zeros((b, sk, 1, 1), dtype=torch.float32)
    plain = (0.0, 0.0, False, -1, -1, None, None)
    return _probs_times(zeros_q, zeros_k, plain, dropout_p, rng_state) != 0


def dropout_pattern(q, k, score_args, dropout_p: float, rng_state: torch.Tensor) -> torch.Tensor:
    """flash-attn's ``S_dmask`` equivalent: (B, Hq, Sq, Sk) in q's dtype.

    Entry (b, h, i, j) is the attention probability P_ij (softmax over visible keys and the sink,
    before dropout, rounded to q's dtype) when key j is kept, and -P_ij when it is dropped; masked
    entries are +0.0 (kept) or -0.0 (dropped). So ``~torch.signbit(S)`` is the keep mask and
    ``S.abs()`` the probabilities. ``score_args`` are anyattn::fwd's (softmax_scale, softcap,
    causal, window_left, window_right, alibi_slopes, sinks). Costs O(B Hq Sq Sk) time and memory:
    a debugging aid, like flash-attn's.
    """
    with torch.no_grad():
        b, sq, hq, _ = q.shape
        probs = _probs_times(q.detach(), k.detach(), score_args, 0.0, None)
        keep = keep_mask(b, sq, hq, k.shape[1], dropout_p, rng_state)
        return torch.where(keep, probs, -probs)


def _varlen_rows(cu_seqlens: torch.Tensor):
    """(rows, sequence, position): every packed row in [cu[0], cu[-1]), its sequence index and its
    position within that sequence, as int64 tensors."""
    cu = cu_seqlens.to(device="cpu", dtype=torch.int64)
    sequence, position = segment_positions(cu[1:] - cu[:-1])
    return cu[sequence] + position, sequence, position


def _varlen_probs_times(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                        score_args, dropout_p, rng_state) -> torch.Tensor:
    """(total_q, Hq, max_seqlen_k): P_ij * Z_ij of packed query row i against key j of its own
    sequence, from varlen forwards on one-hot values."""
    key_rows, _, key_pos = _varlen_rows(cu_seqlens_k)
    cols = []
    for j0 in range(0, max_seqlen_k, _CHUNK):
        width = min(_CHUNK, max_seqlen_k - j0)
        v = torch.zeros((k.shape[0], k.shape[1], width), dtype=q.dtype)
        inside = (key_pos >= j0) & (key_pos < j0 + width)
        v[key_rows[inside], :, key_pos[inside] - j0] = 1
        out, _ = torch.ops.anyattn.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                              max_seqlen_q, max_seqlen_k, *score_args, dropout_p,
                                              rng_state)
        cols.append(out)
    if not cols:
        return q.new_zeros((q.shape[0], q.shape[1], 0))
    return torch.cat(cols, dim=-1)


def varlen_dropout_pattern(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q: int,
                           max_seqlen_k: int, score_args, dropout_p: float,
                           rng_state: torch.Tensor) -> torch.Tensor:
    """dropout_pattern for packed sequences: (batch, Hq, max_seqlen_q, max_seqlen_k) in q's dtype.

    Entry (b, h, i, j) encodes query i and key j of sequence b (positions within the sequence) as
    in dropout_pattern; entries past a sequence's lengths are +0.0. ``score_args`` are
    anyattn::fwd_varlen's (softmax_scale, softcap, causal, window_left, window_right,
    alibi_slopes, sinks); the index tensors are int32 CPU tensors.
    """
    with torch.no_grad():
        q, k = q.detach(), k.detach()
        geometry = (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
        probs = _varlen_probs_times(q, k, *geometry, score_args, 0.0, None)
        zeros_q = torch.zeros((q.shape[0], q.shape[1], 1), dtype=torch.float32)
        zeros_k = torch.zeros((k.shape[0], 1, 1), dtype=torch.float32)
        plain = (0.0, 0.0, False, -1, -1, None, None)
        keep = _varlen_probs_times(zeros_q, zeros_k, *geometry, plain, dropout_p, rng_state) != 0
        signed = torch.where(keep, probs, -probs)
        rows, sequence, position = _varlen_rows(cu_seqlens_q)
        batch = cu_seqlens_q.numel() - 1
        pattern = q.new_zeros((batch, q.shape[1], max_seqlen_q, max_seqlen_k))
        pattern[sequence, :, position, :] = signed[rows]
        return pattern


def pad_to_blocks(pattern: torch.Tensor) -> torch.Tensor:
    """``pattern`` (..., Sq, Sk) zero-padded to (..., round128(Sq), round128(Sk)): the shape of
    flash-attn's ``S_dmask``, whose kernel writes whole 128 x 128 tiles."""
    sq, sk = pattern.shape[-2], pattern.shape[-1]
    pad_q, pad_k = -sq % 128, -sk % 128
    if pad_q == 0 and pad_k == 0:
        return pattern
    return torch.nn.functional.pad(pattern, (0, pad_k, 0, pad_q))


def maybe_rng_state(dropout_p: float) -> Optional[torch.Tensor]:
    """draw_rng_state() when ``dropout_p > 0``, else None (no generator draw)."""
    return draw_rng_state() if dropout_p > 0.0 else None
