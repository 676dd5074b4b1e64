"""anyattn's own CPU kernels, reached through the C ABI, for numpy arrays and CPU torch tensors."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core
from ._tensors import numpy_dtype_code, numpy_spec, torch_dtype_code, torch_module, torch_spec

_NUMPY_DROPOUT_MESSAGE = (
    "dropout_p > 0 is not supported for numpy inputs: numpy calls are forward-only (no autograd, "
    "no random generator to draw the dropout seed from). Pass torch tensors to train with "
    "attention dropout (the seed then comes from torch's default generator), or use "
    "dropout_p=0.0 for inference."
)

_U64 = (1 << 64) - 1


def reject_numpy_dropout(dropout_p: float) -> None:
    """Raise NotImplementedError if dropout is requested on numpy inputs (forward-only, no RNG)."""
    if dropout_p > 0.0:
        raise NotImplementedError(_NUMPY_DROPOUT_MESSAGE)


def seed_offset(rng_state: Optional[Any]) -> Tuple[int, int]:
    """(seed, offset) as unsigned 64-bit ints from an int64 tensor (2,), or (0, 0) for None.

    The int64 values are reinterpreted as uint64 (two's complement), as the C ABI expects.
    """
    if rng_state is None:
        return 0, 0
    seed, offset = (int(x) & _U64 for x in rng_state.tolist())
    return seed, offset


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
    dropout_p: float = 0.0,
    rng_state: Optional[Any] = None,
) -> Tuple[Any, Any]:
    """Dense forward on CPU torch tensors: the body of the ``anyattn::fwd`` op.

    Returns (out (B, Sq, Hq, Dv) contiguous in q's dtype, lse (B, Hq, Sq) float32). ``softmax_scale``
    0 selects 1/sqrt(D). With ``dropout_p > 0`` the keep mask is keyed by ``rng_state``, an int64
    tensor (2,) holding (seed, offset) (see seed_offset). Shapes and dtypes are assumed checked by
    the caller.
    """
    torch = torch_module()
    code = torch_dtype_code(q.dtype)
    if code is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    seed, offset = seed_offset(rng_state)
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
        dropout_p=dropout_p,
        dropout_seed=seed,
        dropout_offset=offset,
    )
    return out, lse


def torch_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    alibi_slopes: Optional[Any],
    sinks: Optional[Any],
    dropout_p: float,
    rng_state: Optional[Any],
) -> Tuple[Any, Any, Any, Any]:
    """Dense backward on CPU torch tensors: the body of the ``anyattn::bwd`` op.

    Every argument after ``lse`` must be what the forward received. Returns contiguous (dq in q's
    shape, dk in k's, dv in v's, all in q's dtype; dsinks float32 (Hq,), or an empty (0,) tensor
    when there are no sinks). Views of any stride are read in place; only a non-unit last-dimension
    stride (e.g. an expanded dout) is copied.
    """
    torch = torch_module()
    code = torch_dtype_code(q.dtype)
    if code is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use float32, float16 or bfloat16")
    seed, offset = seed_offset(rng_state)
    dq = torch.empty(tuple(q.shape), dtype=q.dtype)
    dk = torch.empty(tuple(k.shape), dtype=q.dtype)
    dv = torch.empty(tuple(v.shape), dtype=q.dtype)
    dsinks = torch.empty((0 if sinks is None else sinks.shape[0],), dtype=torch.float32)
    held = []

    def spec(x, c):
        if x is None:
            return None
        s, t = torch_spec(x, c)
        held.append(t)
        return s

    f32 = _core.DTYPE_F32
    _core.bwd(
        spec(dout.to(q.dtype), code),
        spec(q, code),
        spec(k, code),
        spec(v, code),
        spec(out, code),
        spec(lse, f32),
        spec(dq, code),
        spec(dk, code),
        spec(dv, code),
        None if sinks is None else spec(dsinks, f32),
        softmax_scale,
        softcap,
        causal,
        window_left,
        window_right,
        spec(alibi_slopes, f32),
        spec(sinks, f32),
        dropout_p=dropout_p,
        dropout_seed=seed,
        dropout_offset=offset,
    )
    return dq, dk, dv, dsinks
