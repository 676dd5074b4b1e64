"""Varlen, KV-cache and merge calls on numpy arrays and CPU torch tensors, through the C ABI.

Every function here takes already-checked arguments (see varlen.py, kvcache.py and merge.py) and returns new output
arrays/tensors; the KV-cache call also writes the new keys/values into the caches in place (the
varlen KV-cache call only reads them).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core
from ._kernel_options import KernelOptions, binding_options
from ._tensors import (numpy_dtype_code, numpy_spec, torch_cache_dtype_code, torch_dtype_code,
                       torch_module, torch_spec)


def _is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def float_code(x: Any, name: str) -> int:
    """The anyattn dtype code of a float array/tensor, or TypeError naming ``name``."""
    code = numpy_dtype_code(x.dtype) if _is_numpy(x) else torch_dtype_code(x.dtype)
    if code is None:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; use float32, float16 or "
                        "bfloat16 (bfloat16 only as a torch tensor)")
    return code


def cache_code(cache: Any, name: str) -> int:
    """The dtype code a cache tensor (or new keys/values) is passed with: always its own, so that
    the library checks it against q's (a float cache shares q's dtype) and never reads one dtype's
    memory as another's. 8-bit torch caches (int8, float8) get their cache codes."""
    if not _is_numpy(cache):
        code = torch_cache_dtype_code(cache.dtype)
        if code is not None:
            return code
    return float_code(cache, name)


def _scale_specs(specs: "_Specs", scales) -> Any:
    """The (k_descale, v_descale, k_token_scale, v_token_scale) specs of an 8-bit cache call, or
    None; ``scales`` is _kv_scales.CacheScales or None."""
    if scales is None:
        return None
    return tuple(None if s is None else specs(s, _core.DTYPE_F32) for s in scales)


class _Specs:
    """Builds C ABI specs and keeps every described buffer alive until the call returns."""

    def __init__(self) -> None:
        self.keep = []

    def __call__(self, x: Any, code: Optional[int] = None) -> Any:
        if x is None:
            return None
        if code is None:
            code = float_code(x, "tensor")
        spec, held = numpy_spec(x, code) if _is_numpy(x) else torch_spec(x, code)
        self.keep.append(held)
        return spec

    def i32(self, x: Any) -> Any:
        """Spec of an int32 index tensor (converted from any integer dtype)."""
        if x is None:
            return None
        if _is_numpy(x):
            x = np.ascontiguousarray(x, dtype=np.int32)
        else:
            torch = torch_module()
            x = x.to(device="cpu", dtype=torch.int32).contiguous()
        return self(x, _core.DTYPE_I32)

    def f32(self, x: Any) -> Any:
        """Spec of a per-head float32 tensor (ALiBi slopes, sinks)."""
        if x is None:
            return None
        if _is_numpy(x):
            return self(np.ascontiguousarray(x, dtype=np.float32), _core.DTYPE_F32)
        return self(x.to(torch_module().float32), _core.DTYPE_F32)


def _empty(like: Any, shape: Tuple[int, ...], f32: bool = False) -> Any:
    if _is_numpy(like):
        return np.empty(shape, dtype=np.float32 if f32 else like.dtype)
    torch = torch_module()
    return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype)


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q: int,
                   max_seqlen_k: int, options: KernelOptions):
    """anyattn_fwd_varlen: returns (out (total_q, Hq, Dv) in q's dtype, lse (Hq, total_q) f32).

    Rows of q outside every sequence are 0 in out and -inf in lse. With dropout (torch only) the
    keep mask is keyed by ``options.rng_state``.
    """
    specs = _Specs()
    code = float_code(q, "q")
    total_q, hq = q.shape[0], q.shape[1]
    out = _empty(q, (total_q, hq, v.shape[-1]))
    lse = _empty(q, (hq, total_q), f32=True)
    out[...] = 0
    lse[...] = -np.inf
    _core.fwd_varlen(specs(q, code), specs(k, code), specs(v, code), specs(out, code),
                     specs(lse, _core.DTYPE_F32), specs.i32(cu_seqlens_q), specs.i32(cu_seqlens_k),
                     specs.i32(seqused_k), int(max_seqlen_q), int(max_seqlen_k),
                     binding_options(options, specs.f32))
    return out, lse


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                    max_seqlen_q: int, max_seqlen_k: int, options: KernelOptions,
                    own_forward: bool = False):
    """anyattn_bwd_varlen on CPU torch tensors, with the forward's arguments and options;
    ``own_forward``: out and lse are this library's forward results for these inputs
    (anyattn_fwd_params::bwd_own_forward).

    Returns (dq, dk, dv in q's dtype, shaped like q, k, v, zero in rows outside every sequence
    and, for dk/dv, keys beyond seqused_k; dsinks f32 (Hq,), or (0,) without sinks).
    """
    torch = torch_module()
    specs = _Specs()
    code = float_code(q, "q")
    sinks = options.sinks
    dq = torch.zeros(tuple(q.shape), dtype=q.dtype)
    dk = torch.zeros(tuple(k.shape), dtype=q.dtype)
    dv = torch.zeros(tuple(v.shape), dtype=q.dtype)
    dsinks = torch.empty((0 if sinks is None else sinks.shape[0],), dtype=torch.float32)
    _core.bwd_varlen(specs(dout.to(q.dtype), code), specs(q, code), specs(k, code),
                     specs(v, code), specs(out, code), specs(lse, _core.DTYPE_F32),
                     specs(dq, code), specs(dk, code), specs(dv, code),
                     None if sinks is None else specs(dsinks, _core.DTYPE_F32),
                     specs.i32(cu_seqlens_q), specs.i32(cu_seqlens_k), specs.i32(seqused_k),
                     int(max_seqlen_q), int(max_seqlen_k),
                     binding_options(options, specs.f32, own_forward=own_forward))
    return dq, dk, dv, dsinks


def kvcache_forward(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_seqlen: int, cache_batch_idx, cache_leftpad, block_table,
                    rotary_interleaved: bool, options: KernelOptions, num_splits: int,
                    scales=None):
    """anyattn_fwd_kvcache: appends k/v (when given) into the caches in place and returns
    (out (B, Sq, Hq, Dv) in q's dtype, lse (B, Hq, Sq) f32). The caches are never copied: a cache
    whose last dimension is not unit-stride is rejected by the caller. ``scales``: the checked
    _kv_scales.CacheScales of an 8-bit cache (its token scales written by the append), or None."""
    specs = _Specs()
    code = float_code(q, "q")
    b, sq, hq, _ = q.shape
    out = _empty(q, (b, sq, hq, v_cache.shape[-1]))
    lse = _empty(q, (b, hq, sq), f32=True)
    rotary_code = None if rotary_cos is None else float_code(rotary_cos, "rotary_cos")
    _core.fwd_kvcache(
        specs(q, code), specs(k_cache, cache_code(k_cache, "k_cache")),
        specs(v_cache, cache_code(v_cache, "v_cache")), specs(out, code),
        specs(lse, _core.DTYPE_F32), specs(k, None if k is None else float_code(k, "k")),
        specs(v, None if v is None else float_code(v, "v")), specs.i32(cache_seqlens),
        int(cache_seqlen), specs.i32(cache_batch_idx), specs.i32(cache_leftpad),
        specs.i32(block_table), specs(rotary_cos, rotary_code), specs(rotary_sin, rotary_code),
        bool(rotary_interleaved), binding_options(options, specs.f32, num_splits),
        _scale_specs(specs, scales))
    return out, lse


def kvcache_varlen_forward(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q: int, cache_seqlens,
                           cache_seqlen: int, cache_batch_idx, cache_leftpad, block_table,
                           options: KernelOptions, num_splits: int, scales=None):
    """anyattn_fwd_kvcache_varlen: packed queries (total_q, Hq, D) against a cache it only reads
    (an 8-bit one with ``scales`` as in kvcache_forward).

    Returns (out (total_q, Hq, Dv) in q's dtype, lse (Hq, total_q) f32); rows of q outside every
    sequence are 0 in out and -inf in lse, as in varlen_forward.
    """
    specs = _Specs()
    code = float_code(q, "q")
    total_q, hq = q.shape[0], q.shape[1]
    out = _empty(q, (total_q, hq, v_cache.shape[-1]))
    lse = _empty(q, (hq, total_q), f32=True)
    out[...] = 0
    lse[...] = -np.inf
    _core.fwd_kvcache_varlen(
        specs(q, code), specs(k_cache, cache_code(k_cache, "k_cache")),
        specs(v_cache, cache_code(v_cache, "v_cache")), specs(out, code),
        specs(lse, _core.DTYPE_F32), specs.i32(cu_seqlens_q), int(max_seqlen_q),
        specs.i32(cache_seqlens), int(cache_seqlen), specs.i32(cache_batch_idx),
        specs.i32(cache_leftpad), specs.i32(block_table),
        binding_options(options, specs.f32, num_splits), _scale_specs(specs, scales))
    return out, lse


def merge_states(out_a, lse_a, out_b, lse_b, out=None, lse_out=None):
    """anyattn_merge_attention_states into new arrays, or into ``out``/``lse_out`` when given
    (which may be out_a/lse_a: the in-place form). Returns (out, lse_out)."""
    specs = _Specs()
    code = float_code(out_a, "out_a")
    if out is None:
        out = _empty(out_a, tuple(out_a.shape))
    if lse_out is None:
        lse_out = _empty(out_a, tuple(lse_a.shape), f32=True)
    _core.merge_attention_states(specs(out_a, code), specs(lse_a, _core.DTYPE_F32),
                                 specs(out_b, code), specs(lse_b, _core.DTYPE_F32),
                                 specs(out, code), specs(lse_out, _core.DTYPE_F32))
    return out, lse_out
