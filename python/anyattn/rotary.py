"""Rotary position embeddings (RoPE) with flash_attn.layers.rotary 2.8 semantics, in plain torch.

Conventions shared by every function here:

* ``cos`` and ``sin`` have shape ``(seqlen_ro, rotary_dim / 2)``: row ``p`` holds the cosines and
  sines of the angles for position ``p``. Only the first ``rotary_dim`` channels of each head are
  rotated; the rest pass through unchanged.
* Channel pairs are ``(i, i + rotary_dim / 2)`` (GPT-NeoX, the default) or ``(2i, 2i + 1)``
  (GPT-J, ``interleaved=True``). A pair ``(a, b)`` at position ``p`` becomes
  ``(a cos - b sin, a sin + b cos)``, i.e. ``(a + ib) * exp(i angle)``.
* Token ``s`` of sequence ``b`` sits at position ``seqlen_offsets + s`` (an int) or
  ``seqlen_offsets[b] + s`` (a ``(batch,)`` tensor). With ``cu_seqlens`` the tokens of sequence
  ``b`` are rows ``cu_seqlens[b]:cu_seqlens[b + 1]`` of x; rows outside every sequence pass
  through unchanged.
* The arithmetic runs in float32 (float64 for float64 inputs) and the result has x's dtype.
  The backward of a rotation is the rotation by the negated angle, so gradients flow to x only.

Value-dependent checks (tensor offsets, cu_seqlens contents) run eagerly and are skipped while
torch.compile traces; there, a position past ``seqlen_ro`` is left unrotated, as upstream's
kernel does.
"""

from __future__ import annotations

import operator
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "ApplyRotaryEmb",
    "ApplyRotaryEmbKV_",
    "ApplyRotaryEmbQKV_",
    "RotaryEmbedding",
    "apply_rotary_emb",
    "apply_rotary_emb_func",
    "apply_rotary_emb_kv_",
    "apply_rotary_emb_qkv_",
    "apply_rotary_emb_torch",
    "rotate_half",
]

Offsets = Union[int, Tensor]


def _checking_values() -> bool:
    """Whether value-dependent checks may run: always, except while torch.compile traces."""
    return not torch.compiler.is_compiling()


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# Argument checks. Each names the public function, the parameter, the value and what is allowed.
# ---------------------------------------------------------------------------------------------


def _check_x(where: str, name: str, x, layout: str, ndim: int) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor of shape {layout}, "
                        f"got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{where}: {name} must have shape {layout}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{where}: {name} must be a floating-point tensor, got {x.dtype}")


def _check_cos_sin(where: str, names: Tuple[str, str], cos, sin, x: Tensor) -> None:
    """Raise unless cos and sin are matching ``(seqlen_ro, rotary_dim / 2)`` tables for x."""
    for name, table in zip(names, (cos, sin)):
        if not isinstance(table, Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor of shape "
                            f"(seqlen_ro, rotary_dim / 2), got {type(table).__name__}")
        if table.ndim != 2:
            raise ValueError(f"{where}: {name} must have shape (seqlen_ro, rotary_dim / 2), "
                             f"got shape {tuple(table.shape)}")
        if not table.is_floating_point():
            raise TypeError(f"{where}: {name} must be a floating-point tensor, "
                            f"got {table.dtype}")
        if table.device != x.device:
            raise ValueError(f"{where}: {name} is on {table.device} but x is on {x.device}; "
                             f"they must be on the same device")
    if cos.shape != sin.shape:
        raise ValueError(f"{where}: {names[0]} has shape {tuple(cos.shape)} but {names[1]} has "
                         f"shape {tuple(sin.shape)}; they must have the same shape "
                         f"(seqlen_ro, rotary_dim / 2)")
    rotary_dim, headdim = 2 * cos.shape[1], x.shape[-1]
    if rotary_dim > headdim:
        raise ValueError(f"{where}: rotary_dim = 2 * {names[0]}.shape[1] = {rotary_dim} is "
                         f"larger than headdim = {headdim}; rotary_dim must be <= headdim")


def _check_offsets(where: str, seqlen_offsets, batch: int, x: Tensor) -> Offsets:
    """Return the offsets as an int >= 0 or a validated ``(batch,)`` int32/int64 tensor."""
    if isinstance(seqlen_offsets, Tensor):
        if tuple(seqlen_offsets.shape) != (batch,):
            raise ValueError(f"{where}: seqlen_offsets as a tensor must have shape (batch,) = "
                             f"({batch},), got {tuple(seqlen_offsets.shape)}")
        if seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{where}: seqlen_offsets as a tensor must have dtype int32 or "
                            f"int64, got {seqlen_offsets.dtype}")
        if seqlen_offsets.device != x.device:
            raise ValueError(f"{where}: seqlen_offsets is on {seqlen_offsets.device} but x is on "
                             f"{x.device}; they must be on the same device")
        return seqlen_offsets
    if isinstance(seqlen_offsets, bool):
        raise TypeError(f"{where}: seqlen_offsets must be an int or a (batch,) int tensor, "
                        f"got bool {seqlen_offsets}")
    try:
        offset = operator.index(seqlen_offsets)
    except TypeError:
        raise TypeError(f"{where}: seqlen_offsets must be an int or a (batch,) int32/int64 "
                        f"tensor, got {type(seqlen_offsets).__name__}") from None
    if offset < 0:
        raise ValueError(f"{where}: seqlen_offsets must be >= 0, got {offset}")
    return offset


def _check_varlen(where: str, cu_seqlens, max_seqlen, x: Tensor) -> int:
    """Raise unless cu_seqlens and max_seqlen describe x's rows; return the batch size."""
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.numel() < 1:
        got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, Tensor) else type(cu_seqlens)
        raise ValueError(f"{where}: cu_seqlens must be a 1-D tensor of shape (batch + 1,), "
                         f"got {got}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{where}: cu_seqlens must have dtype int32 or int64, "
                        f"got {cu_seqlens.dtype}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"{where}: cu_seqlens is on {cu_seqlens.device} but x is on {x.device}; "
                         f"they must be on the same device")
    if max_seqlen is None:
        raise ValueError(f"{where}: max_seqlen is None; it must be given with cu_seqlens")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt)) \
            or max_seqlen < 0:
        raise ValueError(f"{where}: max_seqlen must be an int >= 0, got {max_seqlen!r}")
    batch = cu_seqlens.shape[0] - 1
    if _checking_values() and batch > 0:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        first, last = int(cu_seqlens[0]), int(cu_seqlens[-1])
        if first < 0 or bool((lengths < 0).any()):
            raise ValueError(f"{where}: cu_seqlens must start at >= 0 and never decrease, got "
                             f"{cu_seqlens.tolist()}")
        if last > x.shape[0]:
            raise ValueError(f"{where}: cu_seqlens[-1] = {last} is past the {x.shape[0]} rows "
                             f"of x")
        longest = int(lengths.max())
        if longest > max_seqlen:
            raise ValueError(f"{where}: a sequence in cu_seqlens has {longest} tokens, more "
                             f"than max_seqlen = {max_seqlen}")
    return batch


def _check_positions(where: str, offsets: Offsets, seqlen: int, seqlen_ro: int,
                     lengths: Optional[Tensor]) -> None:
    """Raise unless every position ``offset + s`` (s < sequence length) is a row of cos/sin.

    ``seqlen`` is the padded length (max_seqlen with cu_seqlens); ``lengths`` the actual
    per-sequence lengths with cu_seqlens, else None.
    """
    if seqlen > seqlen_ro:
        raise ValueError(f"{where}: cos/sin have {seqlen_ro} rows (seqlen_ro) but the sequences "
                         f"have up to {seqlen} tokens; seqlen_ro must be >= seqlen")
    if isinstance(offsets, int):
        if offsets + seqlen > seqlen_ro:
            raise ValueError(f"{where}: seqlen_offsets + seqlen = {offsets} + {seqlen} = "
                             f"{offsets + seqlen} exceeds the {seqlen_ro} rows of cos/sin "
                             f"(seqlen_ro); positions must stay below seqlen_ro")
        return
    if not _checking_values() or offsets.numel() == 0:
        return
    lowest = int(offsets.min())
    if lowest < 0:
        raise ValueError(f"{where}: seqlen_offsets holds {lowest}; offsets must be >= 0")
    if lengths is None:
        ends = offsets.to(torch.int64) + seqlen
    else:
        ends = torch.where(lengths > 0, offsets.to(torch.int64) + lengths, 0)
    end = int(ends.max())
    if end > seqlen_ro:
        b = int(ends.argmax())
        raise ValueError(f"{where}: sequence {b} with seqlen_offsets[{b}] = {int(offsets[b])} "
                         f"reaches position {end - 1}, past the {seqlen_ro} rows of cos/sin "
                         f"(seqlen_ro)")


# ---------------------------------------------------------------------------------------------
# The rotation itself.
# ---------------------------------------------------------------------------------------------


def _token_positions(x: Tensor, offsets: Offsets, cu_seqlens: Optional[Tensor]
                     ) -> Tuple[Tensor, Optional[Tensor]]:
    """Rotary position of every token, and which tokens rotate (None: all of them).

    Shapes: ``(seqlen,)`` for a padded batch with an int offset (shared by the batch),
    ``(batch, seqlen)`` with tensor offsets, ``(total,)`` with cu_seqlens.
    """
    if cu_seqlens is None:
        steps = torch.arange(x.shape[1], device=x.device)
        if isinstance(offsets, int):
            return steps + offsets, None
        return offsets.to(torch.int64).unsqueeze(1) + steps, None
    rows = torch.arange(x.shape[0], device=x.device, dtype=cu_seqlens.dtype)
    batch = cu_seqlens.shape[0] - 1
    sequence = torch.searchsorted(cu_seqlens, rows, right=True) - 1
    inside = (sequence >= 0) & (sequence < batch)
    sequence = sequence.clamp(0, batch - 1)
    positions = (rows - cu_seqlens[sequence]).to(torch.int64)
    if isinstance(offsets, int):
        positions = positions + offsets
    else:
        positions = positions + offsets.to(torch.int64)[sequence]
    return positions, inside


def _angles_at(positions: Tensor, rotates: Optional[Tensor], cos: Tensor, sin: Tensor,
               dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Rows of cos and sin at ``positions``; identity (cos 1, sin 0) where a token must not
    rotate or its position is outside the table."""
    seqlen_ro = cos.shape[0]
    in_table = (positions >= 0) & (positions < seqlen_ro)
    rotates = in_table if rotates is None else rotates & in_table
    rows = positions.clamp(0, seqlen_ro - 1).flatten()
    shape = (*positions.shape, cos.shape[1])
    cos_at = cos.index_select(0, rows).view(shape).to(dtype)
    sin_at = sin.index_select(0, rows).view(shape).to(dtype)
    keep = rotates.unsqueeze(-1)
    return torch.where(keep, cos_at, 1.0), torch.where(keep, sin_at, 0.0)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, offsets: Offsets,
            cu_seqlens: Optional[Tensor], interleaved: bool, inplace: bool,
            conjugate: bool) -> Tensor:
    """Rotate the first rotary_dim channels of x; arguments already validated.

    x is ``(batch, seqlen, *heads, headdim)``, or ``(total, *heads, headdim)`` with cu_seqlens,
    with any number of head dimensions. Returns x itself when ``inplace``, else a new tensor.
    """
    half = cos.shape[1]
    rotary_dim = 2 * half
    no_sequences = cu_seqlens is not None and cu_seqlens.shape[0] < 2
    if rotary_dim == 0 or x.numel() == 0 or cos.shape[0] == 0 or no_sequences:
        return x if inplace else x.clone()
    dtype = _compute_dtype(x.dtype)
    positions, rotates = _token_positions(x, offsets, cu_seqlens)
    cos_at, sin_at = _angles_at(positions, rotates, cos, sin, dtype)
    token_ndim = 1 if cu_seqlens is not None else 2
    head_ndim = x.ndim - token_ndim - 1
    broadcast = (*cos_at.shape[:-1], *([1] * head_ndim), half)
    cos_at, sin_at = cos_at.view(broadcast), sin_at.view(broadcast)
    if conjugate:
        sin_at = -sin_at

    part = x[..., :rotary_dim].to(dtype)
    if interleaved:
        first, second = part[..., 0::2], part[..., 1::2]
    else:
        first, second = part[..., :half], part[..., half:]
    new_first = first * cos_at - second * sin_at
    new_second = first * sin_at + second * cos_at
    if interleaved:
        rotated = torch.stack((new_first, new_second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((new_first, new_second), dim=-1)
    rotated = rotated.to(x.dtype)
    if inplace:
        x[..., :rotary_dim].copy_(rotated)
        return x
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _validated_rotation_args(where: str, x: Tensor, cos, sin, seqlen_offsets, cu_seqlens,
                             max_seqlen) -> Offsets:
    """All checks of apply_rotary_emb; returns the normalized offsets."""
    if cu_seqlens is None:
        _check_x(where, "x", x, "(batch, seqlen, nheads, headdim)", 4)
        batch, seqlen, lengths = x.shape[0], x.shape[1], None
    else:
        _check_x(where, "x", x, "(total_seqlen, nheads, headdim) when cu_seqlens is given", 3)
        batch = _check_varlen(where, cu_seqlens, max_seqlen, x)
        seqlen, lengths = max_seqlen, cu_seqlens[1:] - cu_seqlens[:-1]
    _check_cos_sin(where, ("cos", "sin"), cos, sin, x)
    offsets = _check_offsets(where, seqlen_offsets, batch, x)
    _check_positions(where, offsets, seqlen, cos.shape[0], lengths)
    return offsets


# ---------------------------------------------------------------------------------------------
# Public functions and their autograd Functions.
# ---------------------------------------------------------------------------------------------


def _saved_offsets(ctx, offsets: Offsets, *tensors: Optional[Tensor]) -> None:
    """Save tensors for backward; an int offset goes on ctx, a tensor offset is saved last."""
    if isinstance(offsets, Tensor):
        ctx.int_offset = None
        ctx.save_for_backward(*tensors, offsets)
    else:
        ctx.int_offset = offsets
        ctx.save_for_backward(*tensors)


def _restored_offsets(ctx) -> Tuple[Tuple[Optional[Tensor], ...], Offsets]:
    saved = ctx.saved_tensors
    if ctx.int_offset is None:
        return saved[:-1], saved[-1]
    return saved, ctx.int_offset


def _needs_autograd(x: Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


class ApplyRotaryEmb(torch.autograd.Function):
    """Autograd Function behind apply_rotary_emb (same arguments, same checks).

    The output of an in-place call shares x's storage. Only x receives a gradient.
    """

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                cu_seqlens=None, max_seqlen=None):
        offsets = _validated_rotation_args("apply_rotary_emb", x, cos, sin, seqlen_offsets,
                                           cu_seqlens, max_seqlen)
        out = _rotate(x, cos, sin, offsets, cu_seqlens, interleaved, inplace, conjugate=False)
        _saved_offsets(ctx, offsets, cos, sin, cu_seqlens)
        ctx.interleaved = interleaved
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (cos, sin, cu_seqlens), offsets = _restored_offsets(ctx)
        grad_x = _rotate(grad_out, cos, sin, offsets, cu_seqlens, ctx.interleaved,
                         inplace=False, conjugate=True)
        return grad_x, None, None, None, None, None, None, None


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: Offsets = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Tensor:
    """Rotate the first rotary_dim channels of every head of x by its position's angles.

    Args:
        x: ``(batch, seqlen, nheads, headdim)``, or ``(total_seqlen, nheads, headdim)`` when
            cu_seqlens is given; floating point.
        cos, sin: ``(seqlen_ro, rotary_dim / 2)`` floating tables on x's device, any float dtype;
            ``rotary_dim <= headdim``.
        interleaved: rotate channel pairs (2i, 2i+1) (GPT-J) instead of (i, i + rotary_dim/2)
            (GPT-NeoX).
        inplace: write the result into x and return x.
        seqlen_offsets: int >= 0, or ``(batch,)`` int32/int64 tensor: position of each
            sequence's first token.
        cu_seqlens: optional ``(batch + 1,)`` int32/int64 row boundaries of the sequences in x.
        max_seqlen: int, required with cu_seqlens: an upper bound on the sequence lengths.

    Returns:
        Same shape and dtype as x; channels past rotary_dim are copied unchanged, and with
        cu_seqlens rows outside every sequence are unchanged. With ``inplace`` the result is x
        itself when no gradient is recorded, else a tensor sharing x's storage (as upstream).

    Raises:
        TypeError, ValueError: rotary_dim > headdim, cos/sin shape mismatch, a position
            ``offset + s`` at or past seqlen_ro (for an int offset, ``seqlen_offsets + seqlen``
            (max_seqlen with cu_seqlens) must be <= seqlen_ro), malformed cu_seqlens, a missing
            max_seqlen, or wrong types/devices.
    """
    if _needs_autograd(x):
        return ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, seqlen_offsets,
                                    cu_seqlens, max_seqlen)
    with torch.no_grad():
        offsets = _validated_rotation_args("apply_rotary_emb", x, cos, sin, seqlen_offsets,
                                           cu_seqlens, max_seqlen)
        return _rotate(x, cos, sin, offsets, cu_seqlens, interleaved, inplace, conjugate=False)


apply_rotary_emb_func = apply_rotary_emb


def _qk_views(where: str, qkv: Tensor, num_heads_q: Optional[int]) -> Tuple[Tensor, Tensor]:
    """Check a packed qkv tensor and return views of its q and k parts.

    5-D qkv ``(batch, seqlen, 3, nheads, headdim)`` gives ``(b, s, nheads, d)`` views; 4-D qkv
    ``(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)`` gives ``(b, s, num_heads_q, d)``
    and ``(b, s, num_heads_k, d)`` views.
    """
    if not isinstance(qkv, Tensor) or qkv.ndim not in (4, 5):
        got = tuple(qkv.shape) if isinstance(qkv, Tensor) else type(qkv).__name__
        raise ValueError(f"{where}: qkv must have shape (batch, seqlen, 3, nheads, headdim) or "
                         f"(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim), got {got}")
    if not qkv.is_floating_point():
        raise TypeError(f"{where}: qkv must be a floating-point tensor, got {qkv.dtype}")
    if qkv.ndim == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"{where}: 5-D qkv must have shape (batch, seqlen, 3, nheads, "
                             f"headdim), got {tuple(qkv.shape)}")
        return qkv[:, :, 0], qkv[:, :, 1]
    heads = qkv.shape[2]
    if num_heads_q is None:
        raise ValueError(f"{where}: num_heads_q is None; it is required for 4-D qkv of shape "
                         f"(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)")
    if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int) \
            or not 0 < num_heads_q < heads or (heads - num_heads_q) % 2 != 0:
        raise ValueError(f"{where}: num_heads_q = {num_heads_q!r} does not split the {heads} "
                         f"heads of qkv into num_heads_q + 2 * num_heads_k with num_heads_k >= 1")
    num_heads_k = (heads - num_heads_q) // 2
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + num_heads_k]


def _qk_joint_view(qkv: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """One view covering q and k, so shared cos/sin rotate both in one pass."""
    if qkv.ndim == 5:
        return qkv[:, :, :2]
    return qkv[:, :, :q.shape[2] + k.shape[2]]


def _rotate_qk_(qkv: Tensor, q: Tensor, k: Tensor, cos, sin, cos_k, sin_k, offsets: Offsets,
                interleaved: bool, conjugate: bool) -> None:
    """Rotate the q and k views of qkv in place; k uses cos_k/sin_k when given."""
    if cos_k is None and sin_k is None:
        _rotate(_qk_joint_view(qkv, q, k), cos, sin, offsets, None, interleaved, True, conjugate)
        return
    _rotate(q, cos, sin, offsets, None, interleaved, True, conjugate)
    _rotate(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, offsets, None,
            interleaved, True, conjugate)


def _validated_qkv_args(qkv, cos, sin, cos_k, sin_k, seqlen_offsets, num_heads_q):
    where = "apply_rotary_emb_qkv_"
    q, k = _qk_views(where, qkv, num_heads_q)
    _check_cos_sin(where, ("cos", "sin"), cos, sin, qkv)
    offsets = _check_offsets(where, seqlen_offsets, qkv.shape[0], qkv)
    _check_positions(where, offsets, qkv.shape[1], cos.shape[0], None)
    if cos_k is not None or sin_k is not None:
        table_k = (cos if cos_k is None else cos_k, sin if sin_k is None else sin_k)
        _check_cos_sin(where, ("cos_k", "sin_k"), *table_k, qkv)
        _check_positions(where, offsets, qkv.shape[1], table_k[0].shape[0], None)
    return q, k, offsets


class ApplyRotaryEmbQKV_(torch.autograd.Function):
    """Autograd Function behind apply_rotary_emb_qkv_ (same arguments, same checks)."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False,
                seqlen_offsets=0, num_heads_q=None):
        q, k, offsets = _validated_qkv_args(qkv, cos, sin, cos_k, sin_k, seqlen_offsets,
                                            num_heads_q)
        _rotate_qk_(qkv, q, k, cos, sin, cos_k, sin_k, offsets, interleaved, conjugate=False)
        _saved_offsets(ctx, offsets, cos, sin, cos_k, sin_k)
        ctx.interleaved = interleaved
        ctx.num_heads_q = num_heads_q
        return qkv

    @staticmethod
    def backward(ctx, grad_qkv):
        (cos, sin, cos_k, sin_k), offsets = _restored_offsets(ctx)
        grad = grad_qkv.clone()
        q, k = _qk_views("apply_rotary_emb_qkv_ backward", grad, ctx.num_heads_q)
        _rotate_qk_(grad, q, k, cos, sin, cos_k, sin_k, offsets, ctx.interleaved,
                    conjugate=True)
        return grad, None, None, None, None, None, None, None


def apply_rotary_emb_qkv_(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    cos_k: Optional[Tensor] = None,
    sin_k: Optional[Tensor] = None,
    interleaved: bool = False,
    seqlen_offsets: Offsets = 0,
    num_heads_q: Optional[int] = None,
) -> Tensor:
    """Rotate q and k of a packed qkv tensor in place; v is untouched.

    Args:
        qkv: ``(batch, seqlen, 3, nheads, headdim)``, or for MQA/GQA
            ``(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)`` (q heads, then k, then v).
        cos, sin: ``(seqlen_ro, rotary_dim / 2)``, for q (and k unless cos_k/sin_k are given).
        cos_k, sin_k: optional tables for k (XPos); a missing one falls back to cos/sin.
        interleaved: GPT-J pairs (2i, 2i+1) instead of GPT-NeoX pairs (i, i + rotary_dim/2).
        seqlen_offsets: int >= 0 or ``(batch,)`` int32/int64 tensor, as in apply_rotary_emb.
        num_heads_q: required for 4-D qkv, ignored for 5-D.

    Returns:
        qkv, rotated in place (a tensor sharing its storage when a gradient is recorded).

    Raises:
        TypeError, ValueError: a bad qkv layout or num_heads_q, plus apply_rotary_emb's checks.
    """
    if _needs_autograd(qkv):
        return ApplyRotaryEmbQKV_.apply(qkv, cos, sin, cos_k, sin_k, interleaved,
                                        seqlen_offsets, num_heads_q)
    with torch.no_grad():
        q, k, offsets = _validated_qkv_args(qkv, cos, sin, cos_k, sin_k, seqlen_offsets,
                                            num_heads_q)
        _rotate_qk_(qkv, q, k, cos, sin, cos_k, sin_k, offsets, interleaved, conjugate=False)
    return qkv


def _validated_kv_args(kv, cos, sin, seqlen_offsets) -> Offsets:
    where = "apply_rotary_emb_kv_"
    _check_x(where, "kv", kv, "(batch, seqlen, 2, nheads, headdim)", 5)
    if kv.shape[2] != 2:
        raise ValueError(f"{where}: kv must have shape (batch, seqlen, 2, nheads, headdim), "
                         f"got {tuple(kv.shape)}")
    _check_cos_sin(where, ("cos", "sin"), cos, sin, kv)
    offsets = _check_offsets(where, seqlen_offsets, kv.shape[0], kv)
    _check_positions(where, offsets, kv.shape[1], cos.shape[0], None)
    return offsets


class ApplyRotaryEmbKV_(torch.autograd.Function):
    """Autograd Function behind apply_rotary_emb_kv_ (same arguments, same checks)."""

    @staticmethod
    def forward(ctx, kv, cos, sin, interleaved=False, seqlen_offsets=0):
        offsets = _validated_kv_args(kv, cos, sin, seqlen_offsets)
        _rotate(kv[:, :, 0], cos, sin, offsets, None, interleaved, True, conjugate=False)
        _saved_offsets(ctx, offsets, cos, sin)
        ctx.interleaved = interleaved
        return kv

    @staticmethod
    def backward(ctx, grad_kv):
        (cos, sin), offsets = _restored_offsets(ctx)
        grad = grad_kv.clone()
        _rotate(grad[:, :, 0], cos, sin, offsets, None, ctx.interleaved, True, conjugate=True)
        return grad, None, None, None, None


def apply_rotary_emb_kv_(
    kv: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    seqlen_offsets: Offsets = 0,
) -> Tensor:
    """Rotate k of a packed kv tensor in place; v is untouched.

    Args:
        kv: ``(batch, seqlen, 2, nheads, headdim)``.
        cos, sin: ``(seqlen_ro, rotary_dim / 2)``.
        interleaved: GPT-J pairs (2i, 2i+1) instead of GPT-NeoX pairs (i, i + rotary_dim/2).
        seqlen_offsets: int >= 0 or ``(batch,)`` int32/int64 tensor, as in apply_rotary_emb.

    Returns:
        kv, rotated in place (a tensor sharing its storage when a gradient is recorded).

    Raises:
        TypeError, ValueError: a bad kv layout, plus apply_rotary_emb's checks.
    """
    if _needs_autograd(kv):
        return ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets)
    with torch.no_grad():
        offsets = _validated_kv_args(kv, cos, sin, seqlen_offsets)
        _rotate(kv[:, :, 0], cos, sin, offsets, None, interleaved, True, conjugate=False)
    return kv


# ---------------------------------------------------------------------------------------------
# Plain-torch reference helpers that upstream also exports.
# ---------------------------------------------------------------------------------------------


def rotate_half(x: Tensor, interleaved: bool = False) -> Tensor:
    """Multiply each channel pair of x by i: ``(a, b) -> (-b, a)``.

    Args:
        x: ``(..., d)`` with d even; pairs are (j, j + d/2), or (2j, 2j+1) when interleaved.

    Returns:
        A new tensor of x's shape and dtype.
    """
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary_emb_torch(x: Tensor, cos: Tensor, sin: Tensor,
                           interleaved: bool = False) -> Tensor:
    """Rotary embedding by differentiable elementwise ops, in x's dtype (no offsets).

    Args:
        x: ``(batch, seqlen, nheads, headdim)``.
        cos, sin: ``(seqlen, rotary_dim / 2)`` or ``(batch, seqlen, rotary_dim / 2)``,
            ``rotary_dim <= headdim``.

    Returns:
        x with its first rotary_dim channels rotated; gradients reach x, cos and sin.

    Raises:
        ValueError: rotary_dim > headdim.
    """
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"apply_rotary_emb_torch: rotary_dim = 2 * cos.shape[-1] = "
                         f"{rotary_dim} is larger than headdim = {x.shape[-1]}")
    if interleaved:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    part = x[..., :rotary_dim]
    rotated = part * cos + rotate_half(part, interleaved) * sin
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


# ---------------------------------------------------------------------------------------------
# The module.
# ---------------------------------------------------------------------------------------------


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding (RoFormer), optionally with XPos scaling, applied in place.

    Args:
        dim: rotary_dim, a positive even int; the first dim channels of each head rotate.
        base: frequency base; pair j turns by ``position * base ** (-2j / dim)``.
        interleaved: GPT-J pairs (2i, 2i+1) instead of GPT-NeoX pairs (i, i + dim/2).
        scale_base: None, or the XPos length scale (e.g. 512): q is multiplied and k divided by
            ``((2j + 0.4 dim) / (1.4 dim)) ** ((position - cache_len // 2) / scale_base)``.
        pos_idx_in_fp32: build positions and frequencies in float32 (recommended); False keeps
            inv_freq's dtype, reproducing models trained in pure bf16/fp16.
        device: device of the inv_freq (and scale) buffers.

    The cos/sin tables (``_cos_cached``, ``_sin_cached`` and, with XPos, ``_cos_k_cached``,
    ``_sin_k_cached``) are built in qkv's dtype and device on demand and grow as needed.

    Raises:
        ValueError: dim is not a positive even int.
    """

    def __init__(self, dim: int, base=10000.0, interleaved=False, scale_base=None,
                 pos_idx_in_fp32=True, device=None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding: dim must be a positive even int, got {dim!r}")
        self.dim = dim
        self.base = float(base)
        self.pos_idx_in_fp32 = pos_idx_in_fp32
        self.interleaved = interleaved
        self.scale_base = scale_base
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        scale = self._compute_scale(device) if scale_base is not None else None
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached: Optional[Tensor] = None
        self._sin_cached: Optional[Tensor] = None
        self._cos_k_cached: Optional[Tensor] = None
        self._sin_k_cached: Optional[Tensor] = None

    def _compute_inv_freq(self, device=None) -> Tensor:
        """``base ** (-2j / dim)`` for j < dim/2, float32."""
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        return 1.0 / (self.base ** exponents)

    def _compute_scale(self, device=None) -> Tensor:
        """XPos per-pair decay base ``(2j + 0.4 dim) / (1.4 dim)``, float32."""
        pairs = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
        return (pairs + 0.4 * self.dim) / (1.4 * self.dim)

    def _update_cos_sin_cache(self, seqlen: int, device=None, dtype=None) -> None:
        """Rebuild the tables for ``seqlen`` positions when they are shorter, on another device
        or dtype, or inference tensors while the module is training."""
        cached = self._cos_cached
        if (cached is not None and seqlen <= self._seq_len_cached and cached.device == device
                and cached.dtype == dtype and not (self.training and cached.is_inference())):
            return
        self._seq_len_cached = seqlen
        if self.pos_idx_in_fp32:
            inv_freq = self.inv_freq
            if inv_freq.dtype != torch.float32:
                inv_freq = self._compute_inv_freq(device)
            positions = torch.arange(seqlen, device=device, dtype=torch.float32)
        else:
            inv_freq = self.inv_freq
            positions = torch.arange(seqlen, device=device, dtype=inv_freq.dtype)
        angles = torch.outer(positions, inv_freq.to(device))
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        decay = self.scale.to(device=device, dtype=torch.float32)
        exponent = (torch.arange(seqlen, device=device, dtype=torch.float32)
                    - seqlen // 2) / self.scale_base
        scale = decay.unsqueeze(0) ** exponent.unsqueeze(1)
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached = (cos / scale).to(dtype)
        self._sin_k_cached = (sin / scale).to(dtype)

    def forward(
        self,
        qkv: Tensor,
        kv: Optional[Tensor] = None,
        seqlen_offset: Offsets = 0,
        max_seqlen: Optional[int] = None,
        num_heads_q: Optional[int] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Rotate q and k in place.

        Args:
            qkv: without kv, packed ``(batch, seqlen, 3, nheads, headdim)`` or
                ``(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)``; with kv, q of
                shape ``(batch, seqlen, nheads, headdim)``.
            kv: optional ``(batch, seqlen, 2, nheads_k, headdim)``; its k is rotated.
            seqlen_offset: int >= 0 or ``(batch,)`` int tensor, the first token's position.
            max_seqlen: grow the tables to this many positions first; needed with a tensor
                seqlen_offset unless the tables are already long enough.
            num_heads_q: required for the 4-D packed layout.

        Returns:
            qkv without kv, else ``(q, kv)``; all rotated in place.

        Raises:
            ValueError: a tensor seqlen_offset before any table exists and no max_seqlen, plus
                the checks of apply_rotary_emb_qkv_ / apply_rotary_emb / apply_rotary_emb_kv_.
        """
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, device=qkv.device,
                                       dtype=qkv.dtype)
        elif self._cos_cached is None:
            raise ValueError("RotaryEmbedding: seqlen_offset is a tensor and max_seqlen is None, "
                             "so no cos/sin table exists yet; pass max_seqlen")
        xpos = self.scale is not None
        if kv is None:
            return apply_rotary_emb_qkv_(
                qkv, self._cos_cached, self._sin_cached,
                self._cos_k_cached if xpos else None, self._sin_k_cached if xpos else None,
                interleaved=self.interleaved, seqlen_offsets=seqlen_offset,
                num_heads_q=num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached,
                             interleaved=self.interleaved, inplace=True,
                             seqlen_offsets=seqlen_offset)
        kv = apply_rotary_emb_kv_(kv, self._cos_k_cached if xpos else self._cos_cached,
                                  self._sin_k_cached if xpos else self._sin_cached,
                                  interleaved=self.interleaved, seqlen_offsets=seqlen_offset)
        return q, kv
