"""torch.library registration of the varlen, KV-cache and merge ops (CPU kernels + fake kernels).

    anyattn::fwd_varlen             -> (out (total_q, Hq, Dv), lse (Hq, total_q))
    anyattn::bwd_varlen             -> (dq, dk, dv, dsinks (Hq,) f32 or (0,) without sinks)
    anyattn::fwd_kvcache            mutates k_cache and v_cache (declared ``Tensor(a!)``,
                                    ``Tensor(b!)``) and, for an 8-bit cache, the token scales
                                    -> (out (B, Sq, Hq, Dv), lse (B, Hq, Sq))
    anyattn::fwd_kvcache_varlen     reads k_cache and v_cache (paged varlen)
                                    -> (out (total_q, Hq, Dv), lse (Hq, total_q))

Both cache ops end with the optional scales of an 8-bit cache (k_descale, v_descale,
k_token_scale, v_token_scale; float32, see kv_quant.py), None for a float cache.
    anyattn::merge_attention_states -> (out, lse)
    anyattn::merge_attention_states_ mutates out_a and lse_a -> ()

Like anyattn::fwd (``_torch_ops.py``) they are defined with ``torch.library.Library`` for low call
overhead; the fake kernels let torch.compile and torch.export trace them.

Autograd: anyattn::fwd_varlen is differentiable in q, k, v and sinks (register_autograd, backward
anyattn::bwd_varlen over anyattn_bwd_varlen); its LSE output is non-differentiable. The KV-cache
ops have no backward (they are for inference, and one mutates its caches): a call that needs a
gradient raises NotImplementedError at ``.backward()`` through ``NoGrad``.

Import this module only when torch is installed.
"""

from __future__ import annotations

import torch

from ._cache import (kvcache_forward, kvcache_varlen_forward, merge_states, varlen_backward,
                     varlen_forward)
from ._kernel_options import KernelOptions, backward_options
from ._kv_scales import CacheScales

_LIB = torch.library.Library("anyattn", "FRAGMENT")
_LIB.define(
    "fwd_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, float softcap, "
    "bool causal, int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, "
    "float dropout_p=0.0, Tensor? rng_state=None) -> (Tensor, Tensor)"
)
_LIB.define(
    "bwd_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, float softcap, bool causal, int window_left, "
    "int window_right, Tensor? alibi_slopes, Tensor? sinks, float dropout_p, Tensor? rng_state, "
    "bool own_forward=False) -> (Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define(
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
    "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens, int cache_seqlen, "
    "Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? block_table, "
    "bool rotary_interleaved, float softmax_scale, float softcap, bool causal, int window_left, "
    "int window_right, Tensor? alibi_slopes, Tensor? sinks, int num_splits, "
    "Tensor? k_descale=None, Tensor? v_descale=None, Tensor(c!)? k_token_scale=None, "
    "Tensor(d!)? v_token_scale=None) -> (Tensor, Tensor)"
)
_LIB.define(
    "fwd_kvcache_varlen(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
    "int max_seqlen_q, Tensor? cache_seqlens, int cache_seqlen, Tensor? cache_batch_idx, "
    "Tensor? cache_leftpad, Tensor? block_table, float softmax_scale, float softcap, bool causal, "
    "int window_left, int window_right, Tensor? alibi_slopes, Tensor? sinks, int num_splits, "
    "Tensor? k_descale=None, Tensor? v_descale=None, Tensor? k_token_scale=None, "
    "Tensor? v_token_scale=None) -> (Tensor, Tensor)"
)
_LIB.define(
    "merge_attention_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) "
    "-> (Tensor, Tensor)"
)
_LIB.define(
    "merge_attention_states_(Tensor(a!) out_a, Tensor(b!) lse_a, Tensor out_b, Tensor lse_b) -> ()"
)


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, softcap, causal, window_left, window_right, alibi_slopes, sinks,
                 dropout_p=0.0, rng_state=None):
    """out (total_q, Hq, Dv) in q's dtype, lse (Hq, total_q) float32."""
    total_q, hq, _ = q.shape
    return q.new_empty((total_q, hq, v.shape[-1])), q.new_empty((hq, total_q), dtype=torch.float32)


def _bwd_varlen_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                     max_seqlen_q, max_seqlen_k, softmax_scale, softcap, causal, window_left,
                     window_right, alibi_slopes, sinks, dropout_p, rng_state, own_forward=False):
    """dq, dk, dv shaped like q, k, v in q's dtype; dsinks float32 (Hq,) or (0,)."""
    n_sinks = 0 if sinks is None else sinks.shape[0]
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape),
            q.new_empty((n_sinks,), dtype=torch.float32))


def _kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                  cache_batch_idx, cache_leftpad, block_table, rotary_interleaved, softmax_scale,
                  softcap, causal, window_left, window_right, alibi_slopes, sinks, num_splits,
                  k_descale=None, v_descale=None, k_token_scale=None, v_token_scale=None):
    """out (B, Sq, Hq, Dv) in q's dtype, lse (B, Hq, Sq) float32; the caches are mutated."""
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v_cache.shape[-1])),
            q.new_empty((b, hq, sq), dtype=torch.float32))


def _kvcache_varlen_fake(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, cache_seqlens,
                         cache_seqlen, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                         softcap, causal, window_left, window_right, alibi_slopes, sinks,
                         num_splits, k_descale=None, v_descale=None, k_token_scale=None,
                         v_token_scale=None):
    """out (total_q, Hq, Dv) in q's dtype, lse (Hq, total_q) float32."""
    total_q, hq, _ = q.shape
    return (q.new_empty((total_q, hq, v_cache.shape[-1])),
            q.new_empty((hq, total_q), dtype=torch.float32))


def _merge_cpu(out_a, lse_a, out_b, lse_b):
    return merge_states(out_a, lse_a, out_b, lse_b)


def _merge_fake(out_a, lse_a, out_b, lse_b):
    return torch.empty_like(out_a, memory_format=torch.contiguous_format), torch.empty_like(
        lse_a, dtype=torch.float32, memory_format=torch.contiguous_format)


def _merge_inplace_cpu(out_a, lse_a, out_b, lse_b):
    merge_states(out_a, lse_a, out_b, lse_b, out=out_a, lse_out=lse_a)


def _merge_inplace_fake(out_a, lse_a, out_b, lse_b):
    return None


# The CPU kernels: the schemas spell the options as scalars; KernelOptions gathers them again.
def _varlen_cpu(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, *options):
    return varlen_forward(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, KernelOptions(*options))


def _bwd_varlen_cpu(dout, q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, *scalars):
    options, own_forward = backward_options(scalars)
    return varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, options,
                           own_forward=own_forward)


def _scales(scale_args):
    """CacheScales of the trailing scale arguments (the dispatcher drops trailing defaults, so
    fewer than four may arrive), or None when all are None."""
    if all(s is None for s in scale_args):
        return None
    return CacheScales(*scale_args, *(None,) * (4 - len(scale_args)))


def _kvcache_cpu(*args):
    """args: the 13 cache arguments (q .. rotary_interleaved), 7 score arguments, num_splits,
    the 4 scales."""
    return kvcache_forward(*args[:13], KernelOptions(*args[13:20]), args[20], _scales(args[21:25]))


def _kvcache_varlen_cpu(*args):
    """args: the 10 cache arguments (q .. block_table), 7 score arguments, num_splits, the 4
    scales."""
    return kvcache_varlen_forward(*args[:10], KernelOptions(*args[10:17]), args[17],
                                  _scales(args[18:22]))


_LIB.impl("fwd_varlen", _varlen_cpu, "CPU")
_LIB.impl("bwd_varlen", _bwd_varlen_cpu, "CPU")
_LIB.impl("fwd_kvcache", _kvcache_cpu, "CPU")
_LIB.impl("fwd_kvcache_varlen", _kvcache_varlen_cpu, "CPU")
_LIB.impl("merge_attention_states", _merge_cpu, "CPU")
_LIB.impl("merge_attention_states_", _merge_inplace_cpu, "CPU")
torch.library.register_fake("anyattn::fwd_varlen", _varlen_fake, lib=_LIB)
torch.library.register_fake("anyattn::bwd_varlen", _bwd_varlen_fake, lib=_LIB)
torch.library.register_fake("anyattn::fwd_kvcache", _kvcache_fake, lib=_LIB)
torch.library.register_fake("anyattn::fwd_kvcache_varlen", _kvcache_varlen_fake, lib=_LIB)
torch.library.register_fake("anyattn::merge_attention_states", _merge_fake, lib=_LIB)
torch.library.register_fake("anyattn::merge_attention_states_", _merge_inplace_fake, lib=_LIB)


def _varlen_setup_context(ctx, inputs, output) -> None:
    """Saves the inputs, out, lse and the dropout rng_state for anyattn::bwd_varlen."""
    (q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, scale, softcap, causal, wl, wr, alibi_slopes,
     sinks, dropout_p, rng_state) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi_slopes, sinks, rng_state)
    ctx.scalars = (max_q, max_k, scale, softcap, causal, wl, wr, dropout_p)


def _varlen_backward(ctx, dout, dlse):
    """Gradients for fwd_varlen's inputs: q, k, v and sinks; None for the rest. out and lse are
    that forward's, so the backward runs with own_forward."""
    q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi_slopes, sinks, rng_state = ctx.saved_tensors
    max_q, max_k, scale, softcap, causal, wl, wr, dropout_p = ctx.scalars
    dq, dk, dv, dsinks = torch.ops.anyattn.bwd_varlen(
        dout, q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, scale, softcap, causal, wl,
        wr, alibi_slopes, sinks, dropout_p, rng_state, own_forward=True)
    return (dq, dk, dv) + (None,) * 11 + (None if sinks is None else dsinks, None, None)


torch.library.register_autograd("anyattn::fwd_varlen", _varlen_backward,
                                setup_context=_varlen_setup_context, lib=_LIB)


class NoGrad(torch.autograd.Function):
    """Runs a forward op inside autograd; its backward raises NotImplementedError."""

    @staticmethod
    def forward(ctx, op, *args):
        """The op itself; the LSE output is marked non-differentiable."""
        out, lse = op(*args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        """Always raises: the KV-cache ops have no backward pass."""
        raise NotImplementedError(
            "anyattn: attention against a KV cache (flash_attn_with_kvcache, or "
            "flash_attn_varlen_func with block_table) has no backward pass; it is an inference "
            "path. Wrap the call in torch.no_grad() or torch.inference_mode(); to train, use "
            "flash_attn_func or flash_attn_varlen_func without block_table."
        )


def records_grad(*tensors) -> bool:
    """True when autograd records a call on ``tensors`` (some tensor among them requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in tensors)


def call(op, *args):
    """``op(*args)``, through NoGrad when autograd would record the call."""
    if records_grad(*args):
        return NoGrad.apply(op, *args)
    return op(*args)
