"""Registration of ``torch.ops.anyattn.fwd`` with torch.library, without compiling against libtorch.

The op is defined with ``torch.library.Library`` (schema + CPU kernel + fake kernel) rather than
``torch.library.custom_op``: the latter wraps every call in Python-level dispatch and autograd
layers that cost far more than the ~20 us budget on small inputs (``python -m anyattn.bench
--overhead`` measures both). The fake kernel lets torch.compile and torch.export trace the op.

Autograd: the backward pass does not exist yet. Calls that need a graph go through
``NoBackward``, whose backward raises NotImplementedError, so a training step fails loudly at
``.backward()`` instead of silently producing no gradient.

Import this module only when torch is installed; ``anyattn/__init__.py`` does so.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._cpu import torch_forward

SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, float softcap, bool causal, "
    "int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks) -> (Tensor, Tensor)"
)

_LIB = torch.library.Library("anyattn", "DEF")
_LIB.define(SCHEMA)


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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """CPU kernel of anyattn::fwd: runs the C library (see anyattn._cpu.torch_forward)."""
    return torch_forward(
        q, k, v, softmax_scale, softcap, causal, window_left, window_right, alibi_slopes, sinks
    )


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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fake (meta) kernel: out (B, Sq, Hq, Dv) contiguous in q's dtype, lse (B, Hq, Sq) float32."""
    b, sq, hq, _ = q.shape
    out = q.new_empty((b, sq, hq, v.shape[-1]))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


_LIB.impl("fwd", _fwd_cpu, "CPU")
torch.library.register_fake("anyattn::fwd", _fwd_fake, lib=_LIB)


class NoBackward(torch.autograd.Function):
    """Runs anyattn::fwd inside autograd; its backward raises NotImplementedError."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, softcap, causal, wl, wr, alibi_slopes, sinks):
        """Forward: the op itself; the LSE output is marked non-differentiable."""
        out, lse = torch.ops.anyattn.fwd(
            q, k, v, softmax_scale, softcap, causal, wl, wr, alibi_slopes, sinks
        )
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        """Always raises: anyattn has no backward pass yet."""
        raise NotImplementedError(
            "anyattn.flash_attn_func has no backward pass on CPU yet (it arrives in a later "
            "release). For training on CPU use torch.nn.functional.scaled_dot_product_attention; "
            "for inference wrap the call in torch.no_grad() or torch.inference_mode()."
        )


def fwd(q, k, v, softmax_scale, softcap, causal, wl, wr, alibi_slopes, sinks):
    """Call anyattn::fwd on CPU tensors, routing through NoBackward when a gradient is wanted."""
    if torch.is_grad_enabled() and (
        q.requires_grad
        or k.requires_grad
        or v.requires_grad
        or (sinks is not None and sinks.requires_grad)
        or (alibi_slopes is not None and alibi_slopes.requires_grad)
    ):
        return NoBackward.apply(q, k, v, softmax_scale, softcap, causal, wl, wr, alibi_slopes, sinks)
    return torch.ops.anyattn.fwd(q, k, v, softmax_scale, softcap, causal, wl, wr, alibi_slopes, sinks)
