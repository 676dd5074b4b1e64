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


def maybe_rng_state(dropout_p: float) -> Optional[torch.Tensor]:
    """draw_rng_state() when ``dropout_p > 0``, else None (no generator draw)."""
    return draw_rng_state() if dropout_p > 0.0 else None
