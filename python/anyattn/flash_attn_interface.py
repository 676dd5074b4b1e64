"""Drop-in replacements for flash-attn 2.x's dense functions.

``from anyattn import flash_attn_func`` in place of ``from flash_attn import flash_attn_func``: the
same names, argument order, defaults and return conventions, plus ``sinks=None`` (per-head sink
logits, sglang's ``s_aux``). Inputs are torch tensors (float32/float16/bfloat16, any device) or
numpy arrays (float32/float16). See docs/python.md for the dispatch rules and the differences from
flash-attn.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _dispatch
from ._checks import check_dense_shapes, check_per_head, check_same_dtype
from ._cpu import numpy_forward, reject_numpy_dropout
from ._options import AttnOptions, make_options
from ._tensors import is_torch_tensor, numpy_dtype_code, torch_dtype_code, torch_module

if torch_module() is not None:
    from . import _dropout, _torch_ops

_TORCH_DTYPES = "float32, float16 or bfloat16"


def _framework(q: Any, others: Tuple[Tuple[str, Any], ...]) -> str:
    """'torch' or 'numpy' after checking that q and ``others`` (name, tensor) are of one kind."""
    if is_torch_tensor(q):
        kind, cls = "torch", torch_module().Tensor
    elif isinstance(q, np.ndarray):
        kind, cls = "numpy", np.ndarray
    else:
        raise TypeError(f"q: expected a torch.Tensor or numpy.ndarray, got {type(q).__name__}")
    for name, x in others:
        if not isinstance(x, cls):
            raise TypeError(f"{name}: expected a {cls.__module__}.{cls.__name__} like q, got {type(x).__name__}")
    return kind


def _zero_scale(q: Any, options: AttnOptions) -> Tuple[Any, float]:
    """The (q, scale) pair to hand the C ABI, where a scale of 0 means "default 1/sqrt(D)".

    An explicit ``softmax_scale=0.0`` (all scores 0 before softcap/ALiBi/masking) is honoured by
    running q*0 with the default scale: every dot product is then exactly 0, or NaN where q or k
    holds an Inf/NaN, which is what 0 * <q, k> gives.
    """
    if options.softmax_scale is None:
        return q, 0.0
    if options.softmax_scale == 0.0:
        if isinstance(q, np.ndarray):
            with np.errstate(invalid="ignore"):  # Inf * 0 = NaN is the intended result
                return q * 0, 0.0
        return q * 0, 0.0
    return q, options.softmax_scale


def _numpy_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs):
    reject_numpy_dropout(options.dropout_p)
    b, _, _, hq, _, _, _ = check_dense_shapes(q, k, v)
    check_same_dtype((("q", q), ("k", k), ("v", v)))
    if numpy_dtype_code(q.dtype) is None:
        raise TypeError(f"q: numpy dtype {q.dtype} is not supported; use float32 or float16 "
                        "(or a torch tensor for bfloat16)")
    if alibi_slopes is not None:
        alibi_slopes = np.asarray(alibi_slopes)
        check_per_head(alibi_slopes, "alibi_slopes", b, hq, allow_batched=True)
    if sinks is not None:
        sinks = np.asarray(sinks)
        check_per_head(sinks, "sinks", b, hq, allow_batched=False)
    q, scale = _zero_scale(q, options)
    out, lse = numpy_forward(q, k, v, scale, options.softcap, options.causal,
                             options.window_size, alibi_slopes, sinks)
    return (out, lse, None) if return_attn_probs else out


def _as_f32(torch, x, name: str, device):
    """A per-head f32 tensor on ``device``: floating inputs are converted to float32."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor like q, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor (float32), got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name}: is on {x.device}, but q is on {device}")
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _torch_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs):
    torch = torch_module()
    b, _, _, hq, _, d, dv = check_dense_shapes(q, k, v)
    check_same_dtype((("q", q), ("k", k), ("v", v)))
    if torch_dtype_code(q.dtype) is None:
        raise TypeError(f"q: dtype {q.dtype} is not supported; use {_TORCH_DTYPES}")
    device = q.device
    for name, x in (("k", k), ("v", v)):
        if x.device != device:
            raise ValueError(f"{name}: is on {x.device}, but q is on {device}; move q, k and v to one device")
    if alibi_slopes is not None:
        alibi_slopes = _as_f32(torch, alibi_slopes, "alibi_slopes", device)
        check_per_head(alibi_slopes, "alibi_slopes", b, hq, allow_batched=True)
    if sinks is not None:
        sinks = _as_f32(torch, sinks, "sinks", device)
        check_per_head(sinks, "sinks", b, hq, allow_batched=False)

    if device.type == "cpu":
        q, scale = _zero_scale(q, options)
        wl, wr = options.window_size
        score_args = (scale, options.softcap, options.causal, wl, wr, alibi_slopes, sinks)
        rng_state = _dropout.maybe_rng_state(options.dropout_p)
        out, lse = _torch_ops.fwd(q, k, v, *score_args, options.dropout_p, rng_state)
        if not return_attn_probs:
            return out
        if rng_state is None:
            return out, lse, None
        return out, lse, _dropout.dropout_pattern(q, k, score_args, options.dropout_p, rng_state)
    return _device_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs, d, dv)


def _device_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs, d, dv):
    """Non-CPU torch tensors: flash_attn, SDPA or the f32 math path, per _dispatch.select_backend."""
    from . import _sdpa  # noqa: PLC0415

    call = _dispatch.CallFeatures(
        dtype=str(q.dtype).replace("torch.", ""), head_dim=d, head_dim_v=dv,
        dropout=options.dropout_p > 0.0, softcap=options.softcap > 0.0,
        alibi=alibi_slopes is not None, window=options.has_window(), sinks=sinks is not None,
        return_lse=bool(return_attn_probs),
    )
    choice = _dispatch.select_backend(q.device.type, call, _dispatch.probe_environment(q.device))
    _dispatch.log_fallback_once(q.device.type, choice)
    if choice.backend == _dispatch.FLASH_ATTN:
        from ._flash_route import flash_attn_call  # noqa: PLC0415

        return flash_attn_call(q, k, v, options, alibi_slopes, return_attn_probs)
    if choice.backend == _dispatch.SDPA:
        return _sdpa.sdpa_attention(q, k, v, options, alibi_slopes, sinks)
    out, lse = _sdpa.math_attention(q, k, v, options, alibi_slopes, sinks)
    return (out, lse, None) if return_attn_probs else out


def _attention(q, k, v, options: AttnOptions, alibi_slopes, sinks, return_attn_probs):
    if _framework(q, (("k", k), ("v", v))) == "numpy":
        return _numpy_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs)
    return _torch_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    sinks=None,
):
    """Exact attention, flash-attn 2.x compatible.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim)
        k: (batch, seqlen_k, nheads_k, headdim); nheads % nheads_k == 0 (GQA/MQA)
        v: (batch, seqlen_k, nheads_k, headdim_v); headdim and headdim_v in [1, 256]
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (pass 0.0 for evaluation,
            as with flash-attn). On CPU the seed is drawn from torch's default generator
            (torch.manual_seed reproduces it); numpy inputs raise NotImplementedError for > 0.
        softmax_scale: scale of QK^T; None means 1/sqrt(headdim). 0.0 is honoured (all scores 0).
        causal: bottom-right aligned causal mask (flash-attn >= 2.1 convention).
        window_size: (left, right) sliding window, -1 = unbounded; key j is visible to query i iff
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        alibi_slopes: (nheads,) or (batch, nheads) float32; adds -slope * |i + seqlen_k - seqlen_q - j|.
        deterministic: accepted for compatibility; anyattn's forward and backward are always
            deterministic (bitwise, for any thread count).
        return_attn_probs: if True, return (out, softmax_lse, S_dmask). S_dmask is None without
            dropout (like flash-attn); with dropout on CPU it is (batch, nheads, seqlen_q,
            seqlen_k) in q's dtype: the probability where kept, its negation where dropped (see
            docs/python.md for how it differs from flash-attn's).
        sinks: optional (nheads,) sink logits (score units, not scaled) joining the softmax denominator.
    Returns:
        out: (batch, seqlen_q, nheads, headdim_v) in q's dtype and framework; with
        return_attn_probs, also softmax_lse (batch, nheads, seqlen_q) float32, natural log (not
        differentiable), and S_dmask.
    Autograd (torch): q, k, v and sinks get gradients; alibi_slopes get none; numpy is forward-only.
    Raises:
        TypeError / ValueError naming the argument for bad input; NotImplementedError for dropout
        on numpy inputs.
    """
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    sinks=None,
):
    """flash_attn_func on packed qkv of shape (batch, seqlen, 3, nheads, headdim).

    q, k and v are strided views into ``qkv`` (no copy). Other arguments and the return value are as
    in flash_attn_func.
    """
    if not (is_torch_tensor(qkv) or isinstance(qkv, np.ndarray)):
        raise TypeError(f"qkv: expected a torch.Tensor or numpy.ndarray, got {type(qkv).__name__}")
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv: expected shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], options, alibi_slopes, sinks,
                      return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    sinks=None,
):
    """flash_attn_func with packed kv of shape (batch, seqlen_k, 2, nheads_k, headdim).

    k and v are strided views into ``kv`` (no copy). Other arguments and the return value are as in
    flash_attn_func.
    """
    if not (is_torch_tensor(kv) or isinstance(kv, np.ndarray)):
        raise TypeError(f"kv: expected a torch.Tensor or numpy.ndarray, got {type(kv).__name__}")
    if kv.ndim != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv: expected shape (batch, seqlen_k, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _attention(q, kv[:, :, 0], kv[:, :, 1], options, alibi_slopes, sinks, return_attn_probs)
