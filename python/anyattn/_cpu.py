"""anyattn's own CPU kernels, reached through the C ABI, for numpy arrays and CPU torch tensors."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import _core
from ._kernel_options import KernelOptions, binding_options
from ._tensors import numpy_dtype_code, numpy_spec, torch_dtype_code, torch_module, torch_spec

_NUMPY_DROPOUT_MESSAGE = (
    "dropout_p > 0 is not supported for numpy inputs: numpy calls are forward-only (no autograd, "
    "no random generator to draw the dropout seed from). Pass torch tensors to train with "
    "attention dropout (the seed then comes from torch's default generator), or use "
    "dropout_p=0.0 for inference."
)


def reject_numpy_dropout(dropout_p: float) -> None:
    """Raise NotImplementedError if dropout is requested on numpy inputs (forward-only, no RNG)."""
    if dropout_p > 0.0:
        raise NotImplementedError(_NUMPY_DROPOUT_MESSAGE)


def numpy_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  options: KernelOptions) -> Tuple[np.ndarray, np.ndarray]:
    """Dense forward on numpy arrays. Returns (out (B, Sq, Hq, Dv) in q's dtype, lse (B, Hq, Sq) f32).

    ``options``' per-head arrays may be of any float dtype. Shapes are assumed checked.
    """
    code = numpy_dtype_code(q.dtype)
    if code is None:
        raise TypeError(
            f"q: numpy dtype {q.dtype} is not supported; use float32 or float16 "
            "(or a torch tensor for bfloat16)"
        )
    b, sq, hq, _ = q.shape
    out = np.empty((b, sq, hq, v.shape[-1]), dtype=q.dtype)
    lse = np.empty((b, hq, sq), dtype=np.float32)
    _dense_forward(q, k, v, out, lse, code, options, numpy_spec, lambda x: np.asarray(x, np.float32))
    return out, lse


def torch_forward(q: Any, k: Any, v: Any, options: KernelOptions) -> Tuple[Any, Any]:
    """Dense forward on CPU torch tensors: the body of the ``anyattn::fwd`` op.

    Returns (out (B, Sq, Hq, Dv) contiguous in q's dtype, lse (B, Hq, Sq) float32). With dropout
    the keep mask is keyed by ``options.rng_state``. Shapes and dtypes are assumed checked by
    the caller.
    """
    torch = torch_module()
    code = torch_dtype_code(q.dtype)
    if code is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    b, sq, hq, _ = q.shape
    out = torch.empty((b, sq, hq, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((b, hq, sq), dtype=torch.float32)
    _dense_forward(q, k, v, out, lse, code, options, torch_spec, lambda x: x.to(torch.float32))
    return out, lse


def _dense_forward(q, k, v, out, lse, code: int, options: KernelOptions, spec_of, as_f32) -> None:
    """_core.fwd on arrays or tensors described by ``spec_of`` (numpy_spec or torch_spec), with
    the per-head tensors converted by ``as_f32``; every described buffer stays alive until the
    call returns."""
    held = []

    def spec(x, c):
        if x is None:
            return None
        s, kept = spec_of(x, c)
        held.append(kept)
        return s

    f32 = _core.DTYPE_F32
    _core.fwd(spec(q, code), spec(k, code), spec(v, code), spec(out, code), spec(lse, f32),
              binding_options(options, lambda x: spec(None if x is None else as_f32(x), f32)))


def torch_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                   options: KernelOptions, own_forward: bool = False) -> Tuple[Any, Any, Any, Any]:
    """Dense backward on CPU torch tensors: the body of the ``anyattn::bwd`` op.

    ``options`` must be the forward's (its rng_state included); ``own_forward``: out and lse are
    this library's forward results for these inputs (anyattn_fwd_params::bwd_own_forward).
    Returns contiguous (dq in q's shape, dk in k's, dv in v's, all in q's dtype; dsinks float32
    (Hq,), or an empty (0,) tensor when there are no sinks). Views of any stride are read in
    place; only a non-unit last-dimension stride (e.g. an expanded dout) is copied.
    """
    torch = torch_module()
    code = torch_dtype_code(q.dtype)
    if code is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    dq = torch.empty(tuple(q.shape), dtype=q.dtype)
    dk = torch.empty(tuple(k.shape), dtype=q.dtype)
    dv = torch.empty(tuple(v.shape), dtype=q.dtype)
    sinks = options.sinks
    dsinks = torch.empty((0 if sinks is None else sinks.shape[0],), dtype=torch.float32)
    held = []

    def spec(x, c):
        if x is None:
            return None
        s, t = torch_spec(x, c)
        held.append(t)
        return s

    f32 = _core.DTYPE_F32
    _core.bwd(spec(dout.to(q.dtype), code), spec(q, code), spec(k, code), spec(v, code),
              spec(out, code), spec(lse, f32), spec(dq, code), spec(dk, code), spec(dv, code),
              None if sinks is None else spec(dsinks, f32),
              binding_options(options, lambda x: spec(
                  None if x is None else x.to(torch.float32), f32), own_forward=own_forward))
    return dq, dk, dv, dsinks
