"""Shared fixtures: deterministic inputs for numpy and torch, and the framework/dtype matrix."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import torch
except ImportError:  # the numpy tests run without torch
    torch = None

# (framework, dtype) pairs under test; torch pairs are skipped when torch is absent.
FRAMEWORK_DTYPES = [
    ("numpy", "float32"),
    ("numpy", "float16"),
    ("torch", "float32"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
]


def make_inputs(framework: str, dtype: str, shapes, seed: int):
    """Random tensors of the given shapes, in ``framework``/``dtype``, plus float64 numpy copies.

    Values are drawn in float64, rounded to ``dtype``, and the float64 copies hold exactly the
    rounded values, so the reference sees what the kernel sees.
    """
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape) for shape in shapes]
    if framework == "numpy":
        native = [a.astype(dtype) for a in arrays]
        exact = [n.astype(np.float64) for n in native]
        return native, exact
    if torch is None:
        pytest.skip("torch is not installed")
    tdtype = getattr(torch, dtype)
    native = [torch.from_numpy(a).to(tdtype) for a in arrays]
    exact = [t.to(torch.float64).numpy() for t in native]
    return native, exact


def to_numpy(x) -> np.ndarray:
    """A float64 numpy copy of a numpy array or torch tensor."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, np.float64)
