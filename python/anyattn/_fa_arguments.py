"""Argument handling shared by the FlashAttention 3 and 4 call styles (fa3_interface.py,
fa4_interface.py): the parameters a CPU cannot honour, performance hints, windows with None sides,
sinks under either name, and the AttnOptions they map to."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._options import AttnOptions, make_options


# ---- Argument handling ----------------------------------------------------------------------

# Parameters of FA3/FA4 that anyattn cannot honour, with what they are for.
_UNSUPPORTED = {
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
            f"{describe_value(value)}, pass {name}=None")


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


def as_int(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as an int (TypeError otherwise), at least ``minimum`` (ValueError otherwise)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {describe_value(value)}")
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
