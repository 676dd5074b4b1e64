"""Argument checks and conversions shared by the varlen, KV-cache and merge front ends: which
framework a tensor belongs to, ranks, the C ABI's softmax-scale convention, index and per-head
tensors in the forms the CPU kernels and the device routes take."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._tensors import is_torch_tensor, torch_module


def _kind(x: Any, name: str) -> str:
    if is_torch_tensor(x):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _check_rank(x: Any, name: str, ndim: int, dims: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected shape {dims}, got {tuple(x.shape)}")


def _empty_s_dmask(q: Any) -> Any:
    """flash-attn's S_dmask without dropout: an empty (0,) array/tensor in q's dtype."""
    return np.empty((0,), q.dtype) if isinstance(q, np.ndarray) else q.new_empty((0,))


def _on_cpu(q: Any) -> bool:
    return isinstance(q, np.ndarray) or q.device.type == "cpu"


def _index_tensor(torch, x):
    """An int32 CPU tensor from None, an int, a list or a tensor of any integer dtype."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    return x.to(device="cpu", dtype=torch.int32)


def _f32(torch, x):
    if x is None:
        return None
    return torch.as_tensor(x).to(torch.float32)


def _f32_on(q, x):
    """A per-head tensor as float32 on q's device (None stays None)."""
    if x is None:
        return None
    return torch_module().as_tensor(x).to(device=q.device, dtype=torch_module().float32)
