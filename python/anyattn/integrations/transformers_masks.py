"""Masks for the transformers integration: the registered mask function and the exact 4-D path.

``anyattn_mask`` is registered in transformers' ``AttentionMaskInterface``. It answers like
transformers' own ``flash_attention_mask`` (None, or the 2-D padding mask) whenever the model's
mask pattern is one the varlen kernel expresses exactly: causal or bidirectional, optionally a
sliding window, padding, and packed sequences in a single row. For any other pattern, which
flash-attention would silently drop or refuse (chunked attention, ``or``-ed overlays such as
bidirectional image tokens, blockwise overlays, model-specific mask functions, packed sequences
in more than one row, static-cache slots that a 2-D mask cannot describe) it returns transformers'
exact 4-D boolean mask, and the attention function then takes ``masked_attention``.

``masked_attention`` computes attention exactly under a given 4-D boolean or additive mask, with
the same arithmetic as transformers' eager path. It materialises the full score matrix.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterator, Optional

import torch

_MASKING_MODULE = "transformers.masking_utils"

# Mask-pattern pieces of transformers.masking_utils that the varlen kernel reproduces exactly
# (causal / bidirectional, sliding window, padding), by qualified name.
_VARLEN_PIECES = frozenset({
    "causal_mask_function",
    "bidirectional_mask_function",
    "sliding_window_overlay.<locals>.inner_mask",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask",
})
# The piece transformers adds when position_ids show packed sequences.
_PACKED_PIECE = "packed_sequence_mask_function.<locals>.inner_mask"
# Wrappers that only intersect or re-index their inner patterns, and the closure variable that
# holds the inner pattern(s). ``or_masks`` is deliberately absent: it widens the pattern.
_INTERSECTING_WRAPPERS = {
    "and_masks.<locals>.and_mask": "mask_functions",
    "remap_positions_for_packed_sequence.<locals>.inner_mask": "mask_function",
    "add_offsets_to_mask_function.<locals>.inner_mask": "mask_function",
}

_warned_dense_mask = False


def _closure_value(fn, name: str):
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells[name].cell_contents if name in cells else None


def _pattern_pieces(mask_function) -> Iterator[Optional[str]]:
    """The qualified names of the pieces a transformers mask function is built from; None for a
    piece that is not one of transformers.masking_utils' own."""
    if getattr(mask_function, "__module__", None) != _MASKING_MODULE:
        yield None
        return
    name = mask_function.__qualname__
    inner_name = _INTERSECTING_WRAPPERS.get(name)
    if inner_name is None:
        yield name
        return
    inner = _closure_value(mask_function, inner_name)
    for piece in inner if isinstance(inner, tuple) else (inner,):
        yield from _pattern_pieces(piece)


def _varlen_expresses(pieces, batch_size: int) -> bool:
    for piece in pieces:
        if piece == _PACKED_PIECE:
            # The attention function rebuilds the packing from position_ids only for one row.
            if batch_size != 1:
                return False
        elif piece not in _VARLEN_PIECES:
            return False
    return True


def anyattn_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs,
) -> Optional[torch.Tensor]:
    """transformers mask-interface function for "anyattn".

    Returns None (no padding: the attention function applies causal / window itself and detects
    packing from position_ids), the 2-D (batch, L) boolean padding mask (L <= kv_length; shorter
    when a static cache has unwritten slots, whose keys are then dropped), or, for patterns the
    varlen kernel cannot express, the exact 4-D boolean mask (batch, 1, q_length, kv_length).
    """
    from transformers.masking_utils import (  # noqa: PLC0415 - optional dependency
        causal_mask_function,
        flash_attention_mask,
        sdpa_mask,
    )

    if mask_function is None:
        mask_function = causal_mask_function
    pieces = set(_pattern_pieces(mask_function))
    seen = int(q_offset) + q_length  # positions written to the cache, this step's included
    # Causal self-attention over a cache sees exactly the written positions, unless the cache is
    # a static one with slots not written yet. (Bidirectional patterns, e.g. cross-attention,
    # have keys of their own length.)
    unwritten_slots = "causal_mask_function" in pieces and kv_offset + kv_length != seen
    if _varlen_expresses(pieces, batch_size):
        if not unwritten_slots:
            return flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                        mask_function, attention_mask)
        if kv_offset == 0 and seen < kv_length:
            # A static cache longer than what was written: as flash-attention does, a 2-D mask
            # as long as the written positions tells the attention function which keys are real.
            if attention_mask is None:
                device = kwargs.get("device", "cpu")
                return torch.ones((batch_size, seen), dtype=torch.bool, device=device)
            if attention_mask.shape[-1] < kv_length:
                return attention_mask.to(torch.bool)
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        use_vmap=kwargs.get("use_vmap", False),
        device=kwargs.get("device", "cpu"),
    )


def _warn_dense_mask_once(mask: torch.Tensor) -> None:
    global _warned_dense_mask
    if _warned_dense_mask:
        return
    _warned_dense_mask = True
    warnings.warn(
        "anyattn: this model hands attention a 4-D mask "
        f"(shape {tuple(mask.shape)}) whose pattern the varlen kernel cannot express; it is "
        "computed exactly by a torch path that materialises the full (batch, heads, Sq, Sk) score "
        "matrix: O(Sq*Sk) memory and time, with no flash-style tiling. Warned once per process.",
        RuntimeWarning,
        stacklevel=3,
    )


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    *,
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Exact attention under a 4-D mask; transformers layout in, flash layout out.

    query (B, Hq, Sq, D), key/value (B, Hk, Sk, D[v]) with Hq a multiple of Hk; ``mask``
    (B or 1, 1 or Hq, Sq, >= Sk): boolean (True = attend) or additive (added to the scores), only
    its first Sk columns used. The mask is the whole pattern: causality and windows must be in it
    (as for transformers' eager path). ``softcap`` caps the scores with tanh before the mask,
    ``s_aux`` (Hq,) adds one sink logit per head to the softmax denominator. Query rows a boolean
    mask leaves without keys are 0. Returns (B, Sq, Hq, Dv).
    """
    if mask.dim() != 4:
        raise ValueError("attention_mask: expected a 4-D mask (batch, heads, Sq, Sk), "
                         f"got shape {tuple(mask.shape)}")
    _warn_dense_mask_once(mask)
    heads_q, heads_k = query.shape[1], key.shape[1]
    if heads_q % heads_k != 0:
        raise ValueError(f"key: {heads_k} key heads do not divide {heads_q} query heads")
    if heads_q != heads_k:
        key = key.repeat_interleave(heads_q // heads_k, dim=1)
        value = value.repeat_interleave(heads_q // heads_k, dim=1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None and softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    mask = mask[..., : key.shape[-2]]
    has_keys = None
    if mask.dtype == torch.bool:
        has_keys = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~has_keys, 0.0)
    else:
        scores = scores + mask
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).to(scores.dtype)
        sinks = sinks.expand(scores.shape[0], -1, scores.shape[2], 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=torch.float32)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if has_keys is not None:
        probs = probs * has_keys
    probs = probs.to(value.dtype)
    if dropout > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs, value).transpose(1, 2).contiguous()
