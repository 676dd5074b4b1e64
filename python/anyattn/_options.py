"""The scalar options of an attention call, checked once and carried to whichever backend runs it."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Tuple


class AttnOptions(NamedTuple):
    """Options shared by every backend, with flash-attn 2.x meanings.

    ``softmax_scale`` is None for the default ``1/sqrt(D)``. ``window_size`` is ``(left, right)``
    with -1 for unbounded; ``causal`` additionally forces ``right = 0`` (bottom-right aligned).
    A NamedTuple rather than a dataclass so that torch.compile traces it without a graph break.
    """

    dropout_p: float = 0.0
    softmax_scale: Optional[float] = None
    causal: bool = False
    window_size: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    deterministic: bool = False

    def effective_window(self) -> Tuple[int, int]:
        """``(left, right)`` after applying ``causal`` (right = 0); -1 means unbounded."""
        left, right = self.window_size
        return left, (0 if self.causal else right)

    def has_window(self) -> bool:
        """True if a sliding window (not just causal) bounds either side."""
        left, right = self.window_size
        return left >= 0 or (right >= 0 and not self.causal)


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    return int(value.__index__())


def make_options(
    dropout_p: Any,
    softmax_scale: Any,
    causal: Any,
    window_size: Any,
    softcap: Any,
    deterministic: Any,
) -> AttnOptions:
    """Validate the flash-attn keyword options and return them as an AttnOptions.

    Raises TypeError for a wrong type and ValueError for a value out of range; each message names the
    argument, the value given and what is accepted.
    """
    try:
        dropout = float(dropout_p)
    except (TypeError, ValueError):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}") from None
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout_p: must be in [0, 1), got {dropout_p!r}")

    scale = None
    if softmax_scale is not None:
        try:
            scale = float(softmax_scale)
        except (TypeError, ValueError):
            raise TypeError(
                f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}"
            ) from None
        if not math.isfinite(scale):
            raise ValueError(f"softmax_scale: must be finite, got {softmax_scale!r}")

    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(
            f"window_size: expected a pair (left, right) of ints, got {window_size!r}"
        ) from None
    left = _as_int(left, "window_size[0]")
    right = _as_int(right, "window_size[1]")
    if left < -1 or right < -1:
        raise ValueError(f"window_size: entries must be >= -1 (-1 = unbounded), got {window_size!r}")

    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__}") from None
    if not (math.isfinite(cap) and cap >= 0.0):
        raise ValueError(f"softcap: must be finite and >= 0 (0 = off), got {softcap!r}")

    return AttnOptions(
        dropout_p=dropout,
        softmax_scale=scale,
        causal=bool(causal),
        window_size=(left, right),
        softcap=cap,
        deterministic=bool(deterministic),
    )
