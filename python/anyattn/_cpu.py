"""anyattn's own CPU kernels, reached through the C ABI, for numpy arrays and CPU torch tensors."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core
from ._tensors import numpy_dtype_code, numpy_spec, torch_dtype_code, torch_module, torch_spec

_DROPOUT_MESSAGE = (
    "dropout_p > 0 is not implemented by anyattn's CPU kernels yet (dropout arrives with the "
    "backward pass). Use dropout_p=0.0 for inference (e.g. model.eval()), or, to train with "
    "attention dropout on CPU, torch.nn.functional.scaled_dot_product_attention(..., dropout_p=p)."
)


def reject_dropout(dropout_p: float) -> None:
    """Raise NotImplementedError if dropout is requested: the CPU kernels do not implement it yet."""
    if dropout_p > 0.0:
        raise NotImplementedError(_DROPOUT_MESSAGE)


def numpy_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window: Tuple[int, int],
    alibi_slopes: Optional[np.ndarray],
    sinks: Optional[np.ndarray],
) -> Tuple[np.ndarray, np.ndarray]:
    """Dense forward on numpy arrays. Returns (out (B, Sq, Hq, Dv) in q's dtype, lse (B, Hq, Sq) f32).

    ``softmax_scale`` 0 selects 1/sqrt(D) (the C ABI's convention). Shapes are assumed checked.
    """
    code = numpy_dtype_code(q.dtype)
    if code is None:
        raise TypeError(
            f"q: numpy dtype {q.dtype} is not supported; use float32 or float16 "
            "(or a torch tensor for bfloat16)"
        )
    b, sq, hq, _ = q.shape
    dv = v.shape[-1]
    out = np.empty((b, sq, hq, dv), dtype=q.dtype)
    lse = np.empty((b, hq, sq), dtype=np.float32)
    qs, q = numpy_spec(q, code)
    ks, k = numpy_spec(k, code)
    vs, v = numpy_spec(v, code)
    alibi_spec = sinks_spec = None
    if alibi_slopes is not None:
        alibi_spec, alibi_slopes = numpy_spec(np.asarray(alibi_slopes, np.float32), _core.DTYPE_F32)
    if sinks is not None:
        sinks_spec, sinks = numpy_spec(np.asarray(sinks, np.float32), _core.DTYPE_F32)
    _core.fwd(
        qs,
        ks,
        vs,
        numpy_spec(out, code)[0],
        numpy_spec(lse, _core.DTYPE_F32)[0],
        softmax_scale,
        softcap,
        causal,
        window[0],
        window[1],
        alibi_spec,
        sinks_spec,
    )
    return out, lse


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    alibi_slopes: Optional[Any],
    sinks: Optional[Any],
) -> Tuple[Any, Any]:
    """Dense forward on CPU torch tensors: the body of the ``anyattn::fwd`` op.

    Returns (out (B, Sq, Hq, Dv) contiguous in q's dtype, lse (B, Hq, Sq) float32). ``softmax_scale``
    0 selects 1/sqrt(D). Shapes and dtypes are assumed checked by the caller.
    """
    torch = torch_module()
    code = torch_dtype_code(q.dtype)
    if code is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    b, sq, hq, _ = q.shape
    out = torch.empty((b, sq, hq, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((b, hq, sq), dtype=torch.float32)
    qs, q = torch_spec(q, code)
    ks, k = torch_spec(k, code)
    vs, v = torch_spec(v, code)
    alibi_spec = sinks_spec = None
    if alibi_slopes is not None:
        alibi_spec, alibi_slopes = torch_spec(alibi_slopes, _core.DTYPE_F32)
    if sinks is not None:
        sinks_spec, sinks = torch_spec(sinks, _core.DTYPE_F32)
    _core.fwd(
        qs,
        ks,
        vs,
        torch_spec(out, code)[0],
        torch_spec(lse, _core.DTYPE_F32)[0],
        softmax_scale,
        softcap,
        causal,
        window_left,
        window_right,
        alibi_spec,
        sinks_spec,
    )
    return out, lse
