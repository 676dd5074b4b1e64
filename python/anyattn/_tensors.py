"""Framework adapters: turn numpy arrays and torch tensors into the C ABI's tensor specs.

A spec is either the tuple ``(data_pointer, dtype_code, shape, strides)`` with strides counted in
elements (torch tensors, bfloat16 numpy arrays), or a float32/float16 numpy array itself, which
``anyattn._core.fwd`` reads through the buffer protocol. Either becomes an ``anyattn_tensor``. Nothing here copies data
unless the layout forces it: a last dimension that is not unit-stride (or, for numpy, a stride that
is not a whole number of elements, or an unaligned buffer) is the only reason to copy.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core

try:
    import torch as _torch
except ImportError:  # torch is optional: numpy alone is enough
    _torch = None

Spec = Tuple[int, int, Tuple[int, ...], Tuple[int, ...]]

_NUMPY_CODES = {np.dtype(np.float32): _core.DTYPE_F32, np.dtype(np.float16): _core.DTYPE_F16}


def torch_module():
    """Return the torch module if torch is installed, else None."""
    return _torch


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a torch.Tensor (always False when torch is not installed)."""
    return _torch is not None and isinstance(x, _torch.Tensor)


def numpy_dtype_code(dtype: np.dtype) -> Optional[int]:
    """The anyattn dtype code of a numpy dtype, or None if anyattn cannot read it.

    float32 and float16 are native numpy types; a 2-byte type named ``bfloat16`` (ml_dtypes, as used
    by JAX) is accepted too.
    """
    code = _NUMPY_CODES.get(dtype)
    if code is None and dtype.name == "bfloat16" and dtype.itemsize == 2:
        code = _core.DTYPE_BF16
    return code


def torch_dtype_code(dtype: Any) -> Optional[int]:
    """The anyattn dtype code of a torch dtype, or None if anyattn cannot read it."""
    torch = torch_module()
    if dtype == torch.float32:
        return _core.DTYPE_F32
    if dtype == torch.float16:
        return _core.DTYPE_F16
    if dtype == torch.bfloat16:
        return _core.DTYPE_BF16
    return None


def torch_cache_dtype_code(dtype: Any) -> Optional[int]:
    """The anyattn dtype code of an 8-bit KV-cache torch dtype (float8_e4m3fn, float8_e5m2,
    int8), or None for any other dtype."""
    torch = torch_module()
    if dtype == torch.float8_e4m3fn:
        return _core.DTYPE_FP8_E4M3
    if dtype == torch.float8_e5m2:
        return _core.DTYPE_FP8_E5M2
    if dtype == torch.int8:
        return _core.DTYPE_I8
    return None


def _unit_last(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> Tuple[int, ...]:
    """Strides with the last one forced to 1 when the last dimension has at most one element.

    Frameworks report arbitrary strides for size-1 dimensions; such a dimension is contiguous.
    """
    if shape and shape[-1] <= 1 and strides[-1] != 1:
        return strides[:-1] + (1,)
    return strides


def numpy_spec(a: np.ndarray, code: int) -> Tuple[Any, np.ndarray]:
    """Spec of a numpy array, plus the array it describes (a copy only if the layout needs one).

    For float32/float16 the spec is the array itself (the extension reads it through the buffer
    protocol); bfloat16 arrays, which the buffer protocol cannot describe, get a tuple spec.
    """
    item = a.itemsize
    flags = a.flags
    if not flags.c_contiguous and (
        not flags.aligned
        or (a.ndim and a.shape[-1] > 1 and a.strides[-1] != item)
        or any(s % item for s in a.strides)
    ):
        a = np.ascontiguousarray(a)
    if code != _core.DTYPE_BF16:
        return a, a
    strides = tuple(s // item for s in a.strides)
    return (a.ctypes.data, code, a.shape, _unit_last(a.shape, strides)), a


def torch_spec(t: Any, code: int) -> Tuple[Spec, Any]:
    """Spec of a CPU torch tensor, plus the tensor it describes (copied only if the last dim is strided)."""
    shape = tuple(t.shape)
    strides = t.stride()
    if shape and shape[-1] > 1 and strides[-1] != 1:
        t = t.contiguous()
        strides = t.stride()
    return (t.data_ptr(), code, shape, _unit_last(shape, strides)), t
