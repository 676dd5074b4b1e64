"""Drop-in replacements for flash-attn 2.x's varlen and KV-cache functions, and merging.

``flash_attn_varlen_func``, ``flash_attn_varlen_qkvpacked_func``, ``flash_attn_varlen_kvpacked_func``
and ``flash_attn_with_kvcache`` keep flash-attn 2.x's names, argument order, defaults and return
conventions, plus ``sinks=None``. ``merge_attention_states`` and ``merge_attention_states_`` (in
place) merge two partial attentions over disjoint key sets. numpy arrays and CPU torch tensors run
anyattn's C kernels (through torch.library ops for torch); torch tensors on other devices run a
per-sequence path over ``flash_attn_func``'s device dispatch. docs/varlen_kvcache.md has the
semantics.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._cache import kvcache_forward, kvcache_varlen_forward, merge_states, varlen_forward
from ._cpu import reject_numpy_dropout
from ._options import make_options
from ._tensors import is_torch_tensor, torch_module

if torch_module() is not None:
    from . import _cache_ops, _dropout
    from ._kvcache_route import CacheCall, kvcache_on_device
    from ._packed_route import varlen_on_device


def _kind(x: Any, name: str) -> str:
    if is_torch_tensor(x):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _check_rank(x: Any, name: str, ndim: int, dims: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected shape {dims}, got {tuple(x.shape)}")


def _scale(q: Any, softmax_scale: Optional[float]) -> Tuple[Any, float]:
    """(q, scale) for the C ABI, whose scale 0 means 1/sqrt(D); an explicit 0.0 runs q * 0."""
    if softmax_scale is None:
        return q, 0.0
    if softmax_scale == 0.0:
        return q * 0, 0.0
    return q, float(softmax_scale)


def _empty_s_dmask(q: Any) -> Any:
    """flash-attn's S_dmask without dropout: an empty (0,) array/tensor in q's dtype."""
    return np.empty((0,), q.dtype) if isinstance(q, np.ndarray) else q.new_empty((0,))


def _on_cpu(q: Any) -> bool:
    return isinstance(q, np.ndarray) or q.device.type == "cpu"


# ---- Varlen -------------------------------------------------------------------------------------


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
            alibi_slopes, sinks, return_attn_probs, seqused_k=None):
    out, lse, s_dmask, _ = varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, options, alibi_slopes, sinks,
                                       return_attn_probs, seqused_k)
    return (out, lse, s_dmask) if return_attn_probs else out


def varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
                alibi_slopes, sinks, want_s_dmask, seqused_k=None):
    """The varlen forward on any supported input: (out, lse, S_dmask, rng_state).

    S_dmask follows flash-attn: an empty (0,) array/tensor unless ``want_s_dmask`` and dropout,
    else the dropout pattern (batch, Hq, round128(max_seqlen_q), round128(max_seqlen_k)).
    rng_state is the dropout (seed, offset) int64 tensor (2,) on CPU torch with dropout, else None.
    """
    kind = _kind(q, "q")
    for name, x in (("k", k), ("v", v)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 3, "(total_q, nheads, headdim)")
    _check_rank(k, "k", 3, "(total_k, nheads_k, headdim)")
    _check_rank(v, "v", 3, "(total_k, nheads_k, headdim_v)")
    wl, wr = options.window_size
    rng_state = None
    s_dmask = _empty_s_dmask(q)
    if _on_cpu(q):
        if kind == "numpy":
            reject_numpy_dropout(options.dropout_p)
        q, scale = _scale(q, options.softmax_scale)
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
                int(max_seqlen_k), scale, options.softcap, options.causal, wl, wr, alibi_slopes,
                sinks)
        if kind == "numpy":
            out, lse = varlen_forward(*args)
        else:
            torch = torch_module()
            args = args[:3] + tuple(_index_tensor(torch, x) for x in args[3:6]) + args[6:13] + (
                _f32(torch, alibi_slopes), _f32(torch, sinks))
            rng_state = _dropout.maybe_rng_state(options.dropout_p)
            out, lse = torch.ops.anyattn.fwd_varlen(*args, options.dropout_p, rng_state)
            if want_s_dmask and rng_state is not None:
                pattern = _dropout.varlen_dropout_pattern(args[0], args[1], *args[3:8], args[8:],
                                                          options.dropout_p, rng_state)
                s_dmask = _dropout.pad_to_blocks(pattern)
    else:
        out, lse = varlen_on_device(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                    int(max_seqlen_q), int(max_seqlen_k), options,
                                    _f32_on(q, alibi_slopes), _f32_on(q, sinks), want_s_dmask)
    return out, lse, s_dmask, rng_state


def _index_tensor(torch, x):
    """An int32 CPU tensor from None, an int, a list or a tensor of any integer dtype."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    return x.to(device="cpu", dtype=torch.int32)


def _f32(torch, x):
    if x is None:
        return None
    return torch.as_tensor(x).to(torch.float32)


def _f32_on(q, x):
    """A per-head tensor as float32 on q's device (None stays None)."""
    if x is None:
        return None
    return torch_module().as_tensor(x).to(device=q.device, dtype=torch_module().float32)


def _paged_key_lengths(kind: str, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                       page_size: int):
    """Per-sequence key counts (batch,) int32 for paged varlen (a numpy array, or a CPU tensor for
    torch inputs): seqused_k when given, else cu_seqlens_k's differences. Their shapes are checked
    here, and their values too outside torch.compile tracing (where the C ABI's checks, naming
    cache_seqlens, remain), so that errors name the argument the caller passed."""
    torch = torch_module()

    def as_int32(x):
        return np.asarray(x, dtype=np.int32) if kind == "numpy" else _index_tensor(torch, x)

    batch = len(cu_seqlens_q) - 1
    if seqused_k is not None:
        name, lengths = "seqused_k", as_int32(seqused_k)
        if tuple(lengths.shape) != (batch,):
            raise ValueError(f"seqused_k: expected shape ({batch},) (batch from cu_seqlens_q), "
                             f"got {tuple(lengths.shape)}")
    elif cu_seqlens_k is not None:
        cu_k = as_int32(cu_seqlens_k)
        if tuple(cu_k.shape) != (batch + 1,):
            raise ValueError(f"cu_seqlens_k: expected shape ({batch + 1},) (as cu_seqlens_q), "
                             f"got {tuple(cu_k.shape)}")
        name, lengths = "cu_seqlens_k", cu_k[1:] - cu_k[:-1]
    else:
        raise ValueError("cu_seqlens_k, seqused_k: with block_table, give seqused_k or "
                         "cu_seqlens_k for the key counts; both are None")
    tracing = torch is not None and torch.compiler.is_compiling()
    if block_table.ndim == 2 and not tracing:
        capacity = block_table.shape[1] * page_size
        for b, n in enumerate(lengths.tolist()):
            if n < 0 or n > capacity:
                raise ValueError(f"{name}: sequence {b} has {n} keys; supported: 0 .. {capacity} "
                                 f"(block_table's {block_table.shape[1]} blocks of {page_size})")
    return lengths


def _paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                  block_table, options, alibi_slopes, sinks, return_attn_probs):
    """flash_attn_varlen_func with block_table: packed queries against a paged cache."""
    kind = _kind(q, "q")
    for name, x in (("k", k_cache), ("v", v_cache), ("block_table", block_table)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 3, "(total_q, nheads, headdim)")
    _check_rank(k_cache, "k", 4,
                "(num_blocks, page_block_size, nheads_k, headdim) with block_table")
    _check_rank(v_cache, "v", 4,
                "(num_blocks, page_block_size, nheads_k, headdim_v) with block_table")
    if options.dropout_p > 0.0:
        raise NotImplementedError(
            f"flash_attn_varlen_func: dropout_p is {options.dropout_p}; with block_table (paged "
            "KV, an inference path) only dropout_p=0.0 is supported")
    lengths = _paged_key_lengths(kind, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                 k_cache.shape[1])
    wl, wr = options.window_size
    if _on_cpu(q):
        q, scale = _scale(q, options.softmax_scale)
        args = [q, k_cache, v_cache, cu_seqlens_q, int(max_seqlen_q), lengths, -1, None, None,
                block_table, scale, options.softcap, options.causal, wl, wr, alibi_slopes, sinks,
                0]
        if kind == "numpy":
            out, lse = kvcache_varlen_forward(*args)
        else:
            torch = torch_module()
            for i in (3, 5, 9):
                args[i] = _index_tensor(torch, args[i])
            args[15], args[16] = _f32(torch, alibi_slopes), _f32(torch, sinks)
            out, lse = _cache_ops.call(torch.ops.anyattn.fwd_kvcache_varlen, *args)
    else:
        out, lse = _paged_varlen_on_device(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q,
                                           lengths, block_table, options, alibi_slopes, sinks,
                                           return_attn_probs)
    return (out, lse, _empty_s_dmask(q)) if return_attn_probs else out


def _paged_varlen_on_device(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, lengths,
                            block_table, options, alibi_slopes, sinks, want_lse):
    """Torch tensors off the CPU: each sequence's pages gathered in one indexing operation (batch
    rows of max_blocks pages, the first lengths[b] keys in use), then one packed attention."""
    torch = torch_module()
    batch, max_blocks = block_table.shape
    page = k_cache.shape[1]
    table = block_table.to(device=k_cache.device, dtype=torch.long)
    keys = k_cache[table].reshape(batch * max_blocks * page, *k_cache.shape[2:])
    values = v_cache[table].reshape(batch * max_blocks * page, *v_cache.shape[2:])
    capacity = max_blocks * page
    cu_k = torch.arange(batch + 1, device=q.device, dtype=torch.int32) * capacity
    used = torch.as_tensor(lengths).to(device=q.device)
    return varlen_on_device(q, keys, values, cu_seqlens_q, cu_k, used, int(max_seqlen_q), capacity,
                            options, _f32_on(q, alibi_slopes), _f32_on(q, sinks), want_lse)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, block_table=None, sinks=None,
    seqused_k=None,
):
    """Attention over packed sequences of different lengths, flash-attn 2.x compatible.

    Arguments:
        q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k,
            headdim_v).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 prefix sums: sequence b is rows
            [cu_seqlens[b], cu_seqlens[b+1]).
        max_seqlen_q, max_seqlen_k: at least every sequence's length.
        causal / window_size / softcap / alibi_slopes ((nheads,) or (batch, nheads)) / sinks: as in
            flash_attn_func, applied per sequence (bottom-right aligned per sequence).
        block_table: optional (batch, max_blocks) int32: paged varlen (as vLLM calls it). k and v
            are then paged caches (num_blocks, page_block_size, nheads_k, headdim[_v]), any
            page_block_size >= 1; sequence b's keys are its positions 0 .. n_b - 1, with n_b =
            seqused_k[b] if given, else cu_seqlens_k[b+1] - cu_seqlens_k[b] (cu_seqlens_k may
            then be None). The caches are only read; no dropout and no backward on this path.
        seqused_k: optional (batch,) int32: sequence b uses only its first seqused_k[b] keys.
        dropout_p: as in flash_attn_func (torch tensors only); sequence b uses batch index b's
            mask with positions counted within the sequence. return_attn_probs with dropout raises
            NotImplementedError.
        deterministic: accepted; results are always deterministic.
    Autograd (torch): q, k, v and sinks get gradients (anyattn_bwd_varlen); alibi_slopes none.
    Returns:
        out (total_q, nheads, headdim_v); with return_attn_probs, (out, softmax_lse
        (nheads, total_q) float32, None).
    """
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    if block_table is not None:
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                             block_table, options, alibi_slopes, sinks, return_attn_probs)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options,
                   alibi_slopes, sinks, return_attn_probs, seqused_k)


def flash_attn_varlen_qkvpacked_func(
    qkv, cu_seqlens, max_seqlen, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash_attn_varlen_func on packed qkv (total, 3, nheads, headdim): strided views, no copy."""
    _kind(qkv, "qkv")
    if qkv.ndim != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv: expected shape (total, 3, nheads, headdim), got {tuple(qkv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen,
                   max_seqlen, options, alibi_slopes, sinks, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    deterministic: bool = False, return_attn_probs: bool = False, sinks=None,
):
    """flash_attn_varlen_func with packed kv (total_k, 2, nheads_k, headdim): views, no copy."""
    _kind(kv, "kv")
    if kv.ndim != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv: expected shape (total_k, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    options = make_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    return _varlen(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   options, alibi_slopes, sinks, return_attn_probs)


# ---- KV cache -----------------------------------------------------------------------------------


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None,
    softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
    alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False, sinks=None,
):
    """Attention of q against a KV cache, with optional in-place append; flash-attn 2.x compatible.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or paged
            (num_blocks, page_size, nheads_k, headdim[_v]) with block_table; any page_size >= 1.
        k, v: optional (batch, seqlen_new, nheads_k, headdim[_v]) written into the caches in place
            at cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attention.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2): rotary embedding of q and the
            new k at their absolute positions (q at cache_seqlens[b] + i when causal or windowed,
            else at cache_seqlens[b]); rotary_interleaved selects GPT-J (True) or GPT-NeoX pairs.
        cache_seqlens: int, or (batch,) int32: keys already in the cache. None = the whole cache.
        cache_batch_idx: optional (batch,) int32: the cache batch each sequence reads (contiguous).
        cache_leftpad: optional (batch,) int32: each sequence's keys start at this cache position.
        block_table: optional (batch, max_blocks) int32 for a paged cache.
        softmax_scale, causal, window_size, softcap, alibi_slopes, sinks: as in flash_attn_func,
            with the mask bottom-right aligned to cache_seqlens[b] + seqlen_new - cache_leftpad[b].
        num_splits: key-dimension splits; 0 chooses automatically (never from the thread count).
        return_softmax_lse: also return the LSE (batch, nheads, seqlen_q) float32.
    Returns:
        out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with return_softmax_lse.
    """
    options = make_options(0.0, softmax_scale, causal, window_size, softcap, False)
    kind = _kind(q, "q")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None and _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like q")
    _check_rank(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    _check_rank(k_cache, "k_cache", 4, "(batch_cache, seqlen_cache, nheads_k, headdim)")
    _check_rank(v_cache, "v_cache", 4, "(batch_cache, seqlen_cache, nheads_k, headdim_v)")
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and new values, or neither")
    if k is not None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            last = cache.strides[-1] // cache.itemsize if kind == "numpy" else cache.stride(-1)
            if cache.shape[-1] > 1 and last != 1:
                raise ValueError(f"{name}: the last dimension must be contiguous (stride 1) to be "
                                 f"appended to in place; got stride {last}")
    cache_seqlen = -1
    if cache_seqlens is not None and not hasattr(cache_seqlens, "shape"):
        cache_seqlen = int(cache_seqlens)
        if cache_seqlen < 0:
            raise ValueError(f"cache_seqlens: must be >= 0, got {cache_seqlens}")
        cache_seqlens = None
    wl, wr = options.window_size
    if _on_cpu(q):
        q, scale = _scale(q, options.softmax_scale)
        args = [q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                cache_batch_idx, cache_leftpad, block_table, bool(rotary_interleaved), scale,
                options.softcap, options.causal, wl, wr, alibi_slopes, sinks, int(num_splits)]
        if kind == "numpy":
            out, lse = kvcache_forward(*args)
        else:
            torch = torch_module()
            for i in (7, 9, 10, 11):
                args[i] = _index_tensor(torch, args[i])
            args[18], args[19] = _f32(torch, alibi_slopes), _f32(torch, sinks)
            out, lse = _cache_ops.call(torch.ops.anyattn.fwd_kvcache, *args)
    else:
        call = CacheCall(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_seqlen, cache_batch_idx, cache_leftpad, block_table,
                         bool(rotary_interleaved))
        out, lse = kvcache_on_device(q, call, options, _f32_on(q, alibi_slopes),
                                     _f32_on(q, sinks), int(num_splits), bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out


# ---- Merge --------------------------------------------------------------------------------------


def _check_merge(out_a, lse_a, out_b, lse_b) -> str:
    kind = _kind(out_a, "out_a")
    for name, x in (("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like out_a")
    return kind


def _merge_on_device(out_a, lse_a, out_b, lse_b):
    torch = torch_module()
    # lse (.., H, T) -> (.., T, H, 1) to weight out (.., T, H, Dv).
    la, lb = lse_a.float().transpose(-1, -2)[..., None], lse_b.float().transpose(-1, -2)[..., None]
    top = torch.maximum(la, lb)
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
    wa, wb = torch.exp(la - top), torch.exp(lb - top)
    total = wa + wb
    xa = torch.where(wa > 0, wa * out_a.float(), torch.zeros_like(wa))
    xb = torch.where(wb > 0, wb * out_b.float(), torch.zeros_like(wb))
    out = torch.where(total > 0, (xa + xb) / total, torch.zeros_like(total)).to(out_a.dtype)
    lse = (top + torch.log(total))[..., 0].transpose(-1, -2)
    return out, lse


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merge two attentions of the same queries over disjoint key sets.

    out_a, out_b: (T, H, Dv) with lse (H, T), or (B, S, H, Dv) with lse (B, H, S); lse float32,
    natural log; -inf marks an empty partial result (weight 0, even if its out row holds NaN).
    Returns (out, lse) with out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b) and
    lse = log(e^lse_a + e^lse_b); both empty gives out = 0, lse = -inf.
    """
    kind = _check_merge(out_a, lse_a, out_b, lse_b)
    if kind == "numpy":
        return merge_states(out_a, lse_a, out_b, lse_b)
    if out_a.device.type != "cpu":
        return _merge_on_device(out_a, lse_a, out_b, lse_b)
    return torch_module().ops.anyattn.merge_attention_states(out_a, lse_a, out_b, lse_b)


def merge_attention_states_(out_a, lse_a, out_b, lse_b):
    """In-place merge_attention_states: writes the merged out into out_a and lse into lse_a.

    Returns (out_a, lse_a).
    """
    kind = _check_merge(out_a, lse_a, out_b, lse_b)
    if kind == "numpy":
        merge_states(out_a, lse_a, out_b, lse_b, out=out_a, lse_out=lse_a)
    elif out_a.device.type != "cpu":
        out, lse = _merge_on_device(out_a, lse_a, out_b, lse_b)
        out_a.copy_(out)
        lse_a.copy_(lse)
    else:
        torch_module().ops.anyattn.merge_attention_states_(out_a, lse_a, out_b, lse_b)
    return out_a, lse_a
