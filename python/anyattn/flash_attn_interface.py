"""flash-attn 2.x's ``flash_attn_interface`` module on anyattn.

The dense functions are defined here; the varlen and KV-cache functions (varlen.py, kvcache.py)
are held here too, as upstream's module holds them; and so are flash-attn 2.8's private forward
and backward functions, which libraries such as ring-flash-attn import from this module.
``from anyattn import flash_attn_func`` in place of ``from flash_attn import flash_attn_func``:
the same names, argument order, defaults and return conventions, plus ``sinks=None`` (per-head
sink logits, sglang's ``s_aux``). Inputs are torch tensors (float32/float16/bfloat16, any device)
or numpy arrays (float32/float16). See docs/python.md for the dispatch rules and the differences
from flash-attn.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core, _dispatch
from ._arguments import _empty_s_dmask
from ._checks import check_dense_shapes, check_per_head, check_same_dtype
from ._cpu import numpy_forward, reject_numpy_dropout
from ._kernel_options import kernel_options, kernel_query
from ._options import AttnOptions, make_options
from ._plain_call import float32_per_head, tracing
from ._tensors import is_torch_tensor, numpy_dtype_code, torch_dtype_code, torch_module
from .kvcache import flash_attn_with_kvcache
from .varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    varlen_call,
)

# flash-attn 2.8's flash_attn_interface: the public functions and the private ones that libraries
# built on it import.
__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "_flash_attn_forward",
    "_flash_attn_backward",
    "_flash_attn_varlen_forward",
    "_flash_attn_varlen_backward",
]

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


def _numpy_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs):
    reject_numpy_dropout(options.dropout_p)
    b, _, _, hq, _, _, _ = check_dense_shapes(q, k, v)
    check_same_dtype((("q", q), ("k", k), ("v", v)))
    if numpy_dtype_code(q.dtype) is None:
        raise TypeError(f"q: numpy dtype {q.dtype} is not supported; use float32 or float16 "
                        "(or a torch tensor for bfloat16)")
    if alibi_slopes is not None:
        alibi_slopes = np.asarray(alibi_slopes, np.float32)
        check_per_head(alibi_slopes, "alibi_slopes", b, hq, allow_batched=True)
    if sinks is not None:
        sinks = np.asarray(sinks, np.float32)
        check_per_head(sinks, "sinks", b, hq, allow_batched=False)
    out, lse = numpy_forward(kernel_query(q, options), k, v,
                             kernel_options(options, alibi_slopes, sinks))
    return (out, lse, np.empty((0,), q.dtype)) if return_attn_probs else out


def _as_f32(torch, x, name: str, device):
    """A per-head f32 tensor on ``device``: floating inputs are converted to float32."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor like q, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor (float32), got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name}: is on {x.device}, but q is on {device}")
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _checked_torch_call(q, k, v, alibi_slopes, sinks):
    """Check a dense call on torch tensors; returns (alibi_slopes, sinks) as float32 on q's device
    and the dims (B, Sq, Sk, Hq, Hk, D, Dv)."""
    torch = torch_module()
    dims = check_dense_shapes(q, k, v)
    b, hq = dims[0], dims[3]
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
    return alibi_slopes, sinks, dims


def _torch_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs):
    alibi_slopes, sinks, dims = _checked_torch_call(q, k, v, alibi_slopes, sinks)
    if q.device.type == "cpu":
        out, lse, s_dmask, _ = _cpu_attention(q, k, v, options, alibi_slopes, sinks,
                                              return_attn_probs)
        return (out, lse, s_dmask) if return_attn_probs else out
    d, dv = dims[5], dims[6]
    return _device_attention(q, k, v, options, alibi_slopes, sinks, return_attn_probs, d, dv)


def _cpu_attention(q, k, v, options, alibi_slopes, sinks, want_s_dmask):
    """The dense forward on checked CPU tensors: (out, lse, S_dmask, rng_state).

    S_dmask is flash-attn's when ``want_s_dmask`` (None otherwise): an empty (0,) tensor without
    dropout, else the dropout pattern padded to (B, Hq, round128(Sq), round128(Sk)). rng_state is the dropout
    (seed, offset) int64 tensor (2,), or None without dropout.
    """
    q_run = kernel_query(q, options)
    rng_state = _dropout.maybe_rng_state(options.dropout_p)
    kopts = kernel_options(options, alibi_slopes, sinks, rng_state)
    out, lse = _torch_ops.fwd(q_run, k, v, kopts)
    s_dmask = None
    if want_s_dmask:
        s_dmask = q.new_empty((0,))
        if rng_state is not None:
            pattern = _dropout.dropout_pattern(q_run, k, kopts.score_args(), options.dropout_p,
                                               rng_state)
            s_dmask = _dropout.pad_to_blocks(pattern)
    return out, lse, s_dmask, rng_state


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
    return (out, lse, q.new_empty((0,))) if return_attn_probs else out


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
        v: (batch, seqlen_k, nheads_k, headdim_v); headdim in [0, 576], headdim_v in [0, 512]
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
        return_attn_probs: if True, return (out, softmax_lse, S_dmask). S_dmask is an empty (0,)
            tensor without dropout (like flash-attn); with dropout on CPU it is (batch, nheads,
            round128(seqlen_q), round128(seqlen_k)) in q's dtype: the probability where kept, its
            negation where dropped, zero padding (see docs/python.md for how it differs from
            flash-attn's).
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
    if not tracing():  # a plain CPU torch call runs in one C function (_plain_call.py)
        out = _core.fwd_torch_plain(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                    float32_per_head(alibi_slopes), return_attn_probs,
                                    float32_per_head(sinks))
        if isinstance(out, tuple):  # (out, lse): return_attn_probs
            return out + (_empty_s_dmask(q),)
        if out is not None:
            return out
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


# ---- flash-attn 2.8's private functions ---------------------------------------------------------
# Libraries that drive attention block by block (ring-flash-attn, zigzag and llama3 context
# parallelism) call these directly: they keep the LSE, combine blocks themselves and run the
# backward of each block against the global out and LSE. Signatures, defaults and return tuples
# are flash-attn 2.8's; libraries read them with inspect.getfullargspec, so they stay plain
# functions with positional parameters.


def _private_tensors(fn: str, q, tensors) -> None:
    """Check that the private functions' tensors are CPU torch tensors: the CUDA route is the real
    flash_attn package's, which install_as_flash_attn leaves in charge there."""
    if not is_torch_tensor(q):
        raise TypeError(f"q: {fn} takes torch tensors, got {type(q).__name__}")
    for name, x in tensors:
        if x is not None and not is_torch_tensor(x):
            raise TypeError(f"{name}: {fn} takes torch tensors, got {type(x).__name__}")
        if x is not None and x.device.type != "cpu":
            raise NotImplementedError(
                f"{name}: {fn} on {x.device} tensors needs the real flash_attn package; anyattn "
                "serves this private function on CPU tensors only")


def _no_rng_state():
    """The rng_state a call without dropout returns: zeros, as nothing was drawn."""
    return torch_module().zeros((2,), dtype=torch_module().int64)


def _softmax_d(dout, out):
    """rowsum(dout * out) in float32, the quantity D of the attention backward, with heads first."""
    return (dout.float() * out.float()).sum(-1).transpose(-1, -2)


def _fill(destination, gradient):
    """Copy ``gradient`` into the caller's buffer when it gave one (flash-attn fills dq/dk/dv)."""
    if destination is not None:
        destination.copy_(gradient)


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                        window_size_right, softcap, alibi_slopes, return_softmax):
    """flash-attn 2.8's dense forward without autograd, on CPU torch tensors.

    Arguments are flash_attn_func's, with the window split into ``window_size_left`` and
    ``window_size_right`` and ``return_softmax`` in place of ``return_attn_probs``.
    Returns (out (B, Sq, Hq, Dv), softmax_lse (B, Hq, Sq) float32, S_dmask, rng_state): S_dmask is
    the dropout pattern padded to (B, Hq, round128(Sq), round128(Sk)) when ``return_softmax`` and
    dropout, else an empty (0,) tensor; rng_state is the int64 (2,) tensor that
    _flash_attn_backward takes to replay the same dropout mask.
    """
    _private_tensors("_flash_attn_forward", q, (("k", k), ("v", v), ("alibi_slopes", alibi_slopes)))
    options = make_options(dropout_p, softmax_scale, causal,
                           (window_size_left, window_size_right), softcap, False)
    alibi_slopes, _, _ = _checked_torch_call(q, k, v, alibi_slopes, None)
    with torch_module().no_grad():
        out, lse, s_dmask, rng_state = _cpu_attention(q, k, v, options, alibi_slopes, None,
                                                      bool(return_softmax))
    if s_dmask is None:
        s_dmask = q.new_empty((0,))
    return out, lse, s_dmask, _no_rng_state() if rng_state is None else rng_state


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         deterministic, rng_state=None):
    """flash-attn 2.8's dense backward, on CPU torch tensors: fills dq, dk and dv in place.

    ``out`` and ``softmax_lse`` may be those of a larger attention that this call's keys are one
    block of (ring attention): the probabilities are exp(score - softmax_lse), so each block's
    gradients add up to the whole attention's. ``rng_state`` is _flash_attn_forward's, when
    dropout_p > 0. dq, dk and dv may be None (that gradient is then not returned to the caller).
    Returns softmax_d (B, Hq, round128(Sq)) float32: rowsum(dout * out), zero-padded.
    """
    _private_tensors("_flash_attn_backward", q, (
        ("dout", dout), ("k", k), ("v", v), ("out", out), ("softmax_lse", softmax_lse),
        ("dq", dq), ("dk", dk), ("dv", dv), ("alibi_slopes", alibi_slopes)))
    torch = torch_module()
    options = make_options(dropout_p, softmax_scale, causal,
                           (window_size_left, window_size_right), softcap, deterministic)
    alibi_slopes, _, (b, sq, _, hq, _, _, dv_dim) = _checked_torch_call(q, k, v, alibi_slopes, None)
    _check_like(dout, "dout", (b, sq, hq, dv_dim))
    _check_like(out, "out", (b, sq, hq, dv_dim))
    _check_like(softmax_lse, "softmax_lse", (b, hq, sq))
    kopts = kernel_options(options, alibi_slopes, None,
                           rng_state if options.dropout_p > 0.0 else None)
    with torch.no_grad():
        grads = torch.ops.anyattn.bwd(dout, kernel_query(q, options), k, v, out,
                                      softmax_lse.float(), *kopts)
        gq, gk, gv = grads[0], grads[1], grads[2]
        if options.softmax_scale == 0.0:
            gq = gq.zero_()  # scores are scale * <q, k>: no gradient reaches q at scale 0
        for destination, gradient in ((dq, gq), (dk, gk), (dv, gv)):
            _fill(destination, gradient)
        return torch.nn.functional.pad(_softmax_d(dout, out), (0, -sq % 128))


def _check_like(x, name: str, shape) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (from q, k and v), got "
                         f"{tuple(x.shape)}")


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size_left=-1,
                               window_size_right=-1, softcap=0.0, alibi_slopes=None,
                               return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None):
    """flash-attn 2.8's varlen forward without autograd, on CPU torch tensors.

    Arguments are flash_attn_varlen_func's (``block_table``: k and v are paged caches;
    ``seqused_k``: sequence b uses its first seqused_k[b] keys). ``leftpad_k`` is not supported
    (NotImplementedError); flash_attn_with_kvcache's ``cache_leftpad`` serves that case.
    Returns (out (total_q, Hq, Dv), softmax_lse (Hq, total_q) float32, S_dmask, rng_state) with
    S_dmask (batch, Hq, round128(max_seqlen_q), round128(max_seqlen_k)) when ``return_softmax``
    and dropout, else empty.
    """
    _private_tensors("_flash_attn_varlen_forward", q, (("k", k), ("v", v)))
    if leftpad_k is not None:
        raise NotImplementedError(
            "leftpad_k: not supported by anyattn's _flash_attn_varlen_forward; pass leftpad_k=None "
            "(flash_attn_with_kvcache's cache_leftpad covers left-padded caches)")
    options = make_options(dropout_p, softmax_scale, causal,
                           (window_size_left, window_size_right), softcap, False)
    torch = torch_module()
    with torch.no_grad():
        if block_table is not None:
            out, lse, s_dmask = flash_attn_varlen_func(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                options.softmax_scale, options.causal, options.window_size, options.softcap,
                alibi_slopes, return_attn_probs=True, block_table=block_table,
                seqused_k=seqused_k)
            rng_state = None
        else:
            out, lse, s_dmask, rng_state = varlen_call(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
                alibi_slopes, None, bool(return_softmax), seqused_k)
    return out, lse, s_dmask, _no_rng_state() if rng_state is None else rng_state


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None):
    """flash-attn 2.8's varlen backward, on CPU torch tensors: fills dq, dk and dv in place.

    As _flash_attn_backward, for packed sequences: ``out`` and ``softmax_lse`` (Hq, total_q) may
    belong to a larger attention whose keys this call sees one block of. Rows outside every
    sequence get zero gradients. Returns softmax_d (Hq, total_q + 128 * batch) float32:
    rowsum(dout * out), zero-padded as flash-attn's is.
    """
    _private_tensors("_flash_attn_varlen_backward", q, (
        ("dout", dout), ("k", k), ("v", v), ("out", out), ("softmax_lse", softmax_lse),
        ("dq", dq), ("dk", dk), ("dv", dv), ("alibi_slopes", alibi_slopes)))
    torch = torch_module()
    options = make_options(dropout_p, softmax_scale, causal,
                           (window_size_left, window_size_right), softcap, deterministic)
    for name, x, rank in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("dout", dout, 3),
                          ("out", out, 3), ("softmax_lse", softmax_lse, 2)):
        if x.ndim != rank:
            raise ValueError(f"{name}: expected {rank} dimensions (packed varlen layout), got "
                             f"shape {tuple(x.shape)}")
    total_q, hq = q.shape[0], q.shape[1]
    _check_like(dout, "dout", (total_q, hq, v.shape[-1]))
    _check_like(out, "out", (total_q, hq, v.shape[-1]))
    _check_like(softmax_lse, "softmax_lse", (hq, total_q))
    cu_q = cu_seqlens_q.to(device="cpu", dtype=torch.int32)
    cu_k = cu_seqlens_k.to(device="cpu", dtype=torch.int32)
    alibi = None if alibi_slopes is None else _as_f32(torch, alibi_slopes, "alibi_slopes", q.device)
    kopts = kernel_options(options, alibi, None, rng_state if options.dropout_p > 0.0 else None)
    with torch.no_grad():
        grads = torch.ops.anyattn.bwd_varlen(
            dout, kernel_query(q, options), k, v, out, softmax_lse.float(), cu_q, cu_k, None,
            int(max_seqlen_q), int(max_seqlen_k), *kopts)
        gq, gk, gv = grads[0], grads[1], grads[2]
        if options.softmax_scale == 0.0:
            gq = gq.zero_()
        for destination, gradient in ((dq, gq), (dk, gk), (dv, gv)):
            _fill(destination, gradient)
        batch = cu_q.numel() - 1
        softmax_d = torch.zeros((hq, total_q + 128 * batch), dtype=torch.float32)
        softmax_d[:, :total_q] = _softmax_d(dout, out)
        return softmax_d
