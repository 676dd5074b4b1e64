"""Index arithmetic over segments laid end to end, as the sequences of a packed batch are: which
segment each element belongs to, and its position within it.

Computed with numpy: ``torch.repeat_interleave`` with a tensor of counts runs a parallel region,
and waking torch's OpenMP threads for it costs more than the work itself, which matters to the
planning of every varlen, paged and cache call (bench/MEASUREMENTS.md, "Planning without
torch.repeat_interleave").
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch


def segment_positions_np(counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(segment, position within it) of each of sum(counts) elements, for segments of
    ``counts`` (>= 0) elements laid end to end: segment b repeated counts[b] times, in order, and
    0 .. counts[b] - 1 (int64 arrays)."""
    owner = np.repeat(np.arange(counts.size), counts)
    first = np.cumsum(counts) - counts
    return owner, np.arange(owner.size) - first[owner]


def segment_positions(counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """segment_positions_np for an int64 CPU tensor, as tensors."""
    owner, position = segment_positions_np(counts.numpy())
    return torch.from_numpy(owner), torch.from_numpy(position)
