"""Registration of ``torch.ops.anyattn.fwd`` and ``torch.ops.anyattn.bwd`` with torch.library, and
the autograd formula that ties them together, without compiling against libtorch.

    anyattn::fwd(q, k, v, ..., dropout_p, rng_state) -> (out (B, Sq, Hq, Dv), lse (B, Hq, Sq))
    anyattn::bwd(dout, q, k, v, out, lse, ..., dropout_p, rng_state, own_forward=False)
        -> (dq, dk, dv, dsinks)     dsinks is float32 (Hq,), or (0,) when there are no sinks

own_forward=True states that out and lse are this library's forward results for the same inputs
(anyattn_fwd_params::bwd_own_forward in anyattn.h): the autograd formula below passes it; the
flash-attn backward functions do not, since ring attention hands them merged results.

The ops are defined with ``torch.library.Library`` (schema + CPU kernel + fake kernel) rather than
``torch.library.custom_op``: the latter wraps every call in Python-level dispatch layers that cost
far more than the ~20 us budget on small inputs (``python -m anyattn.bench --overhead`` measures
both). The fake kernels let torch.compile and torch.export trace the ops, forward and backward.

Autograd is attached with ``torch.library.register_autograd``: q, k and v get gradients, and so do
the sinks (dsinks); ALiBi slopes get none (like flash-attn, they are treated as constants). The
LSE output is marked non-differentiable (its ``requires_grad`` is False), so a loss that uses it
gets no gradient through it rather than a wrong one. ``rng_state`` is an int64 tensor (2,) holding
the dropout (seed, offset); the backward reuses the forward's, so both see the same keep mask.

Import this module only when torch is installed; ``anyattn/__init__.py`` does so.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._cpu import torch_backward, torch_forward
from ._kernel_options import KernelOptions, backward_options

_SCORE_ARGS = (
    "float softmax_scale, float softcap, bool causal, int window_left, int window_right, "
    "Tensor? alibi_slopes, Tensor? sinks"
)
SCHEMA = (
    f"fwd(Tensor q, Tensor k, Tensor v, {_SCORE_ARGS}, float dropout_p=0.0, "
    "Tensor? rng_state=None) -> (Tensor, Tensor)"
)
BWD_SCHEMA = (
    f"bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_SCORE_ARGS}, "
    "float dropout_p, Tensor? rng_state, bool own_forward=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)

_LIB = torch.library.Library("anyattn", "DEF")
_LIB.define(SCHEMA)
_LIB.define(BWD_SCHEMA)


def _fwd_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    alibi_slopes: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    dropout_p: float = 0.0,
    rng_state: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """CPU kernel of anyattn::fwd: runs the C library (see anyattn._cpu.torch_forward)."""
    return torch_forward(q, k, v, KernelOptions(softmax_scale, softcap, causal, window_left,
                                                window_right, alibi_slopes, sinks, dropout_p,
                                                rng_state))


def _bwd_cpu(dout, q, k, v, out, lse, *scalars):
    """CPU kernel of anyattn::bwd: runs the C library (see anyattn._cpu.torch_backward)."""
    options, own_forward = backward_options(scalars)
    return torch_backward(dout, q, k, v, out, lse, options, own_forward=own_forward)


def _fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    alibi_slopes: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    dropout_p: float = 0.0,
    rng_state: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fake (meta) kernel: out (B, Sq, Hq, Dv) contiguous in q's dtype, lse (B, Hq, Sq) float32."""
    b, sq, hq, _ = q.shape
    out = q.new_empty((b, sq, hq, v.shape[-1]))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, softcap, causal, window_left, window_right,
              alibi_slopes, sinks, dropout_p, rng_state, own_forward=False):
    """Fake (meta) kernel: contiguous dq, dk, dv shaped like q, k, v in q's dtype; dsinks f32."""
    n_sinks = 0 if sinks is None else sinks.shape[0]
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape),
            q.new_empty((n_sinks,), dtype=torch.float32))


_LIB.impl("fwd", _fwd_cpu, "CPU")
_LIB.impl("bwd", _bwd_cpu, "CPU")
torch.library.register_fake("anyattn::fwd", _fwd_fake, lib=_LIB)
torch.library.register_fake("anyattn::bwd", _bwd_fake, lib=_LIB)


def _setup_context(ctx, inputs, output) -> None:
    """Saves what anyattn::bwd needs: the inputs, out, lse and the dropout rng_state."""
    (q, k, v, scale, softcap, causal, wl, wr, alibi_slopes, sinks, dropout_p, rng_state) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks, rng_state)
    ctx.scalars = (scale, softcap, causal, wl, wr, dropout_p)


def _backward(ctx, dout, dlse):
    """Gradients for (q, k, v, ..., sinks, ...): anyattn::bwd with the forward's arguments, and
    own_forward, since out and lse are that forward's."""
    q, k, v, out, lse, alibi_slopes, sinks, rng_state = ctx.saved_tensors
    scale, softcap, causal, wl, wr, dropout_p = ctx.scalars
    dq, dk, dv, dsinks = torch.ops.anyattn.bwd(
        dout, q, k, v, out, lse, scale, softcap, causal, wl, wr, alibi_slopes, sinks, dropout_p,
        rng_state, own_forward=True,
    )
    return (dq, dk, dv, None, None, None, None, None, None,
            None if sinks is None else dsinks, None, None)


torch.library.register_autograd("anyattn::fwd", _backward, setup_context=_setup_context, lib=_LIB)


def runs_eagerly_without_autograd(*tensors) -> bool:
    """True if a call on ``tensors`` (None entries ignored) may run its CPU kernel body directly
    instead of through the dispatcher: plain tensors (no subclass such as FakeTensor or DTensor),
    no torch.compile tracing, and no gradient to record. The dispatcher costs more than the
    kernel at decode shapes, and skipping it leaves the result unchanged."""
    if torch.compiler.is_compiling():
        return False
    grad_mode = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad_mode and t.requires_grad)):
            return False
    return True


def fwd(q, k, v, options: KernelOptions):
    """anyattn::fwd on CPU tensors (differentiable in q, k, v and sinks); the kernel body
    directly when runs_eagerly_without_autograd allows."""
    if runs_eagerly_without_autograd(q, k, v, options.alibi_slopes, options.sinks):
        return torch_forward(q, k, v, options)
    return torch.ops.anyattn.fwd(q, k, v, *options)
