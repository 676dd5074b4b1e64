"""FlashAttention 3's Python API (its top-level ``flash_attn_interface`` module) on anyattn.

The public functions keep FA3's names, positional order, defaults and return values
(Dao-AILab/flash-attention ``hopper/flash_attn_interface.py``), so code written for FA3 runs on
CPU torch tensors (other devices go through anyattn's device dispatch). They are thin mappings onto
anyattn's flash-attn 2.x functions:

- ``window_size``: (left, right), -1 (or None) unbounded; ``causal`` forces right = 0. Masks are
  bottom-right aligned, per sequence.
- ``page_table`` is anyattn's ``block_table`` (any page size). ``sinks`` and ``learnable_sink``
  (keyword-only: sglang's FA3 build and FA4 name them so; upstream FA3 has neither) are per-head
  sink logits joining the softmax denominator; the LSE includes them.
- ``seqused_q``: sequence b computes only its first seqused_q[b] queries, aligned as a sequence of
  that length; its remaining rows are 0 in out and -inf in the LSE (FA3 leaves them unwritten).
- ``attention_chunk`` > 0: on top of causal/window, query i sees key j only if j lies in the same
  chunk of ``attention_chunk`` key positions as i's diagonal key i + Sk - Sq (chunks counted from
  the sequence's first key, after ``cache_leftpad``). Runs as a varlen call with one sub-sequence
  per (sequence, chunk), which keeps the autograd of the dense and varlen functions.
- Performance hints are accepted and change nothing: ``num_splits``, ``pack_gqa``, ``sm_margin``,
  ``deterministic`` (anyattn is always deterministic), ``scheduler_metadata``.
- ``qv`` (absorbed MLA's value-side query: scores softmax_scale * (q . k + qv . v), default
  scale (headdim + headdim_v) ** -0.5) in all three functions (_fa_qv.py). In
  ``flash_attn_with_kvcache`` a cache whose k_cache columns follow v_cache's in one row [v | k]
  (DeepSeek's latent layout) is read in place as a shared latent cache, 8-bit included; separate
  caches are gathered into a copy (float caches only).
- FP8 inputs (_fa3_fp8.py): ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` q, k and v with
  ``q_descale``/``k_descale``/``v_descale`` ((batch, nheads_k), (nheads_k,) or (1,) float32)
  in the three attention functions, and float8 q (and qv) with ``q_descale`` against an 8-bit
  KV cache in ``flash_attn_with_kvcache``, whose ``k_descale``/``v_descale`` are the cache's
  (anyattn.kv_quant). Attention over the dequantized values with P in float32; out is bfloat16,
  as in FA3; no backward, as in FA3. Descales given for float inputs raise ValueError.
- What a CPU cannot honour raises NotImplementedError naming the parameter, only when it is given
  a non-default value (none of FA3's parameters today; FA4's CuTe-DSL hooks, fa4_interface).
- The LSE is float32, natural log, not differentiable (as in FA3).

The machinery lives in _fa_arguments.py, _fa_plan.py, _fa3_cache.py and _fa3_fp8.py, shared with
``fa4_interface`` where FA4 has the same feature.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._fa3_cache import empty_accumulators, kvcache_general
from ._fa3_fp8 import fp8_attention, fp8_cache_queries, is_float8
from ._fa_qv import CachePlan, widen
from ._fa_arguments import as_int, check_hints, chunk_size, fa3_options, pick_sinks
from ._fa_plan import combine_partials, dense_attention, plain_cache_call, varlen_attention
from ._kv_scales import is_8bit
from .kvcache import flash_attn_with_kvcache as _fa2_kvcache


__all__ = [
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
]


def _fp8_call(q, k, v, qv, **descales) -> bool:
    """Whether a call takes FA3's FP8 call style (a float8 q, k or v): descales given for float
    inputs raise ValueError naming them, qv with float8 inputs NotImplementedError."""
    if not any(is_float8(x) for x in (q, k, v)):
        for name, value in descales.items():
            if value is not None:
                raise ValueError(f"{name}: given for {str(q.dtype).replace('torch.', '')} inputs; "
                                 "descales scale float8 q, k and v only (torch.float8_e4m3fn, "
                                 "torch.float8_e5m2)")
        return False
    if qv is not None:
        raise NotImplementedError("qv: not supported by anyattn with float8 q, k and v (the "
                                  "value-side query of absorbed MLA); got a tensor, pass qv=None "
                                  "or bfloat16 inputs")
    return True


# ---- FA3's public functions -------------------------------------------------------------------


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
):
    """flash_attn_func on packed qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen,
    nheads_q + 2 * nheads_k, headdim) with ``num_heads_q`` (GQA). q, k and v are views of qkv
    (gradients reach qkv). Other arguments, raises and returns as in flash_attn_func.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv: expected a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5 and qkv.shape[2] == 3:
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(f"num_heads_q: required with a 4-D qkv {tuple(qkv.shape)} (batch, "
                             "seqlen, nheads_q + 2 * nheads_k, headdim)")
        hq = as_int(num_heads_q, "num_heads_q", minimum=1)
        hk = (qkv.shape[2] - hq) // 2
        if hk < 1 or hq + 2 * hk != qkv.shape[2]:
            raise ValueError(f"num_heads_q: {hq} does not split qkv's {qkv.shape[2]} heads into "
                             "nheads_q + 2 * nheads_k")
        q, k, v = qkv.split([hq, hk, hk], dim=2)
    else:
        raise ValueError(f"qkv: expected (batch, seqlen, 3, nheads, headdim), or 4-D with "
                         f"num_heads_q, got shape {tuple(qkv.shape)}")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale,
                           window_size, attention_chunk, softcap, 1, None, deterministic,
                           sm_margin, return_attn_probs, sinks=sinks,
                           learnable_sink=learnable_sink)


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
):
    """Exact attention, FlashAttention 3 call style.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim);
            v: (batch, seqlen_k, nheads_k, headdim_v). torch float32/float16/bfloat16;
            nheads % nheads_k == 0 (GQA/MQA).
        softmax_scale: None = 1/sqrt(headdim). causal: bottom-right aligned.
        window_size: (left, right), -1 or None = unbounded.
        attention_chunk: 0 = off; > 0 restricts each query to its diagonal's key chunk (module
            docstring).
        softcap: > 0 applies softcap * tanh(scores / softcap).
        num_splits, pack_gqa, deterministic, sm_margin: accepted performance hints.
        sinks / learnable_sink (keyword-only): (nheads,) sink logits; they get gradients.
        qv: (batch, seqlen_q, nheads, headdim_v), q's dtype: adds qv . v to the scores (absorbed
            MLA); softmax_scale then defaults to (headdim + headdim_v) ** -0.5, and headdim +
            headdim_v is at most 576.
        q, k, v in torch.float8_e4m3fn / torch.float8_e5m2 (FA3's FP8 call style, _fa3_fp8.py):
            q_descale, k_descale, v_descale float32 (batch, nheads_k), (nheads_k,) or (1,), or
            None (1); out is then bfloat16 and has no backward. Not with qv.
    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype (bfloat16 for float8 inputs), or
        with return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q) float32).
    Autograd: q, k, v, qv and the sinks get gradients, also with attention_chunk (FA3 has none
    there, and none for qv); none for float8 inputs.
    Raises:
        TypeError / ValueError naming the argument for bad input.
    """
    check_hints(num_splits=num_splits, sm_margin=sm_margin)
    options = fa3_options(softmax_scale, causal, window_size, softcap, deterministic)
    if _fp8_call(q, k, v, qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale):
        out, lse = fp8_attention(q, k, v, None, None, None, None, None, options,
                                 pick_sinks(sinks, learnable_sink), chunk_size(attention_chunk),
                                 0, q_descale, k_descale, v_descale)
        return (out, lse) if return_attn_probs else out
    if qv is not None:
        q, k = widen(q, k, v, qv)
    out, lse = dense_attention(q, k, v, options, chunk_size(attention_chunk),
                               pick_sinks(sinks, learnable_sink), bool(return_attn_probs))
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    sinks=None,
    learnable_sink=None,
    return_softmax_lse=False,
):
    """Attention over packed sequences of different lengths, FlashAttention 3 call style.

    Arguments:
        q: (total_q, nheads, headdim) with cu_seqlens_q (batch + 1,) int32 prefix sums, or
            (batch, seqlen_q, nheads, headdim) with cu_seqlens_q None.
        k, v: (total_k, nheads_k, headdim[_v]) with cu_seqlens_k, or batched with it None.
        max_seqlen_q, max_seqlen_k: bounds on the lengths (computed when None).
        seqused_q: (batch,) int32: sequence b computes its first seqused_q[b] queries (aligned as
            a sequence of that length); its other rows are 0 in out, -inf in the LSE.
        seqused_k: (batch,) int32: sequence b attends its first seqused_k[b] keys.
        qv: (total_q, nheads, headdim_v) (batched like q without cu_seqlens_q), as in
            flash_attn_func.
        Other arguments as in flash_attn_func; ``return_softmax_lse`` (keyword-only, sgl-kernel's
        name) is a synonym of return_attn_probs.
        float8 q, k, v and their descales: as in flash_attn_func (out bfloat16, no backward).
    Returns:
        out (total_q, nheads, headdim_v) (batched like q without cu_seqlens_q), or with
        return_attn_probs (out, softmax_lse (nheads, total_q) float32; (batch, nheads, seqlen_q)
        for batched q).
    Autograd: q, k, v, qv and sinks get gradients (none for float8 inputs).
    Raises:
        ValueError naming the argument for inconsistent cu_seqlens / seqused / shapes.
    """
    check_hints(num_splits=num_splits, sm_margin=sm_margin)
    options = fa3_options(softmax_scale, causal, window_size, softcap, deterministic)
    need_lse = bool(return_attn_probs or return_softmax_lse)
    if _fp8_call(q, k, v, qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale):
        out, lse = fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, None,
                                 options, pick_sinks(sinks, learnable_sink),
                                 chunk_size(attention_chunk), 0, q_descale, k_descale, v_descale)
        return (out, lse) if need_lse else out
    if qv is not None:
        q, k = widen(q, k, v, qv)
    out, lse = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                seqused_q, seqused_k, None, options,
                                pick_sinks(sinks, learnable_sink), chunk_size(attention_chunk),
                                0, need_lse)
    return (out, lse) if need_lse else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Combine split-KV partial results (FA3's fwd_combine).

    Arguments:
        out_partial: (num_splits, batch, seqlen, nheads, headdim) (or (num_splits, total_q,
            nheads, headdim)), usually float32.
        lse_partial: (num_splits, batch, seqlen, nheads) float32 natural-log LSEs, -inf for an
            empty split.
        out: optional preallocated (batch, seqlen, nheads, headdim), written and returned.
        out_dtype: dtype of out; None = out_partial's.
    Returns:
        (out, softmax_lse (batch, seqlen, nheads) float32). Rows whose splits are all empty give
        out 0 and LSE -inf.
    """
    result, lse = combine_partials(out_partial, lse_partial, out_dtype)
    if out is not None:
        if tuple(out.shape) != tuple(result.shape):
            raise ValueError(f"out: expected shape {tuple(result.shape)}, got "
                             f"{tuple(out.shape)}")
        out.copy_(result)
        result = out
    return result, lse


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    *,
    sinks=None,
    learnable_sink=None,
    k_token_scale=None,
    v_token_scale=None,
):
    """Attention of q against a KV cache, with optional in-place append, FA3 call style.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), or packed (total_q, nheads, headdim) with
            cu_seqlens_q (batch + 1,) (max_seqlen_q is then a hint).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or paged
            (num_blocks, page_block_size, nheads_k, headdim[_v]) with page_table (batch,
            max_blocks) int32; any page size.
        k, v: optional new keys/values, (batch, seqlen_new, nheads_k, headdim[_v]) or packed
            (total_new, ...) with cu_seqlens_k_new; written into the caches in place at
            positions cache_seqlens[b] + t (rotated by rotary_cos/sin first when given) before
            attention. cu_seqlens_k_new is ignored without k (as FA3 does).
        cache_seqlens: int or (batch,) int32: keys already in the cache (None = full after the
            append). cache_batch_idx: (batch,) cache batch of each sequence (contiguous cache).
        cache_leftpad: (batch,) first cache position of each sequence's keys.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2); rotary_interleaved selects GPT-J or
            GPT-NeoX pairs. Positions start at rotary_seqlens[b] when given, else cache_seqlens[b];
            q rows are rotated at start + i when causal, windowed or chunked, else at start.
        softmax_scale, causal, window_size, attention_chunk, softcap, sinks / learnable_sink:
            as in flash_attn_func, aligned to each sequence's keys cache_leftpad[b] ..
            cache_seqlens[b] + seqlen_new - 1.
        scheduler_metadata, num_splits, pack_gqa, sm_margin: accepted performance hints.
        k_descale, v_descale: float32 (1,), (nheads_k,) or (batch, nheads_k) scales of an 8-bit
            cache (k_cache/v_cache torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8),
            read as stored * descale * token_scale; k_token_scale, v_token_scale (keyword-only,
            anyattn's) float32 k_cache.shape[:3] per-position scales, written by the append. As
            in anyattn.flash_attn_with_kvcache, also with cu_seqlens_q, cu_seqlens_k_new,
            rotary_seqlens and attention_chunk ((batch, nheads_k) descales indexed by sequence).
        qv: (batch, seqlen_q, nheads, headdim_v) (or packed like q): adds qv . v to the scores
            (absorbed MLA decode), default scale (headdim + headdim_v) ** -0.5. When k_cache's
            columns follow v_cache's in one row [v | k] (same strides; DeepSeek's latent cache,
            e.g. v_cache = cache[..., :512], k_cache = cache[..., 512:]) the row is read once, in
            place, as anyattn's shared latent cache, 8-bit too (k_descale equal to v_descale,
            the same token scale tensor as both; new rows [v | k] are quantized as one).
            Otherwise the keys [k | v] are gathered into a copy for the call (float caches only;
            rotary needs this path, its rotary_dim at most headdim) and new keys are copied back
            into k_cache.
        q (and qv) in torch.float8_e4m3fn / torch.float8_e5m2 against an 8-bit cache (FA3's
            FP8 call style, as sglang's FA3 backend passes it): q_descale float32 (batch,
            nheads_k), (nheads_k,) or (1,), or None (1); out is then bfloat16. New keys and
            values stay float32/float16/bfloat16 (the call quantizes them).
    Returns:
        out (batch, seqlen_q, nheads, headdim_v) (or (total_q, ...) for packed q); with
        return_softmax_lse, FA3's 4-tuple (out, softmax_lse (batch, nheads, seqlen_q) or
        (nheads, total_q) float32, out_accum, softmax_lse_accum), the last two empty tensors.
    Autograd: none (an inference path); a backward through it raises NotImplementedError.
    Raises:
        ValueError naming the argument for indices out of range (checked before any write).
    """
    check_hints(num_splits=num_splits, sm_margin=sm_margin, max_seqlen_q=max_seqlen_q)
    options = fa3_options(softmax_scale, causal, window_size, softcap, False)
    float8_q = is_float8(q)
    if float8_q:
        if not is_8bit(k_cache):
            raise TypeError(f"q: float8 queries ({q.dtype}) read an 8-bit KV cache; k_cache is "
                            f"{k_cache.dtype} (pass q in the cache's dtype)")
        q = fp8_cache_queries(q, q_descale, cu_seqlens_q, k_cache.shape[2])
        if is_float8(qv):
            qv = fp8_cache_queries(qv, q_descale, cu_seqlens_q, k_cache.shape[2])
        if q.dtype == torch.float32 and k is not None and v is not None and not (
                is_float8(k) or is_float8(v)):
            # The call takes q and the new rows in one dtype; widening float rows is exact, and
            # the append quantizes them either way. (Float8 rows are rejected, naming them.)
            k, v = k.float(), v.float()
    elif q_descale is not None:
        raise ValueError(f"q_descale: given for {str(q.dtype).replace('torch.', '')} queries; it "
                         "scales float8 queries only (torch.float8_e4m3fn, torch.float8_e5m2)")
    scales = (k_descale, v_descale, k_token_scale, v_token_scale)
    chunk = chunk_size(attention_chunk)
    sinks = pick_sinks(sinks, learnable_sink)
    splits = max(as_int(num_splits, "num_splits"), 0)
    reads_only = (k is None and v is None and rotary_cos is None and rotary_sin is None
                  and cache_batch_idx is None and cache_leftpad is None and chunk == 0)
    result = plan = None
    if qv is not None and reads_only:
        # Absorbed MLA's decode read (sglang's call: q and qv sliced from one query, the caches
        # the two column ranges of DeepSeek's latent row) runs in one C function when plain.
        result = plain_cache_call(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, page_table,
                                  options, sinks, splits, bool(return_softmax_lse), scales,
                                  qv=qv)
    if qv is not None and result is None:
        plan = CachePlan(q, k_cache, v_cache, k, v, qv, rotary_cos, scales)
        q, k_cache, v_cache, k, v, scales = (plan.q, plan.k_cache, plan.v_cache, plan.k, plan.v,
                                             plan.scales)
    if result is not None:
        out, lse = result
    elif (cu_seqlens_q is None and chunk == 0 and rotary_seqlens is None
            and (k is None or cu_seqlens_k_new is None)):
        # Without the LSE a plain call runs in one C function (_plain_call.py).
        result = _fa2_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, page_table, softmax_scale=options.softmax_scale,
            causal=options.causal, window_size=options.window_size, softcap=options.softcap,
            rotary_interleaved=rotary_interleaved, num_splits=splits,
            return_softmax_lse=bool(return_softmax_lse), sinks=sinks, k_descale=scales[0],
            v_descale=scales[1], k_token_scale=scales[2], v_token_scale=scales[3])
        out, lse = result if return_softmax_lse else (result, None)
    else:
        # sglang's decode and extend steps (packed q against a cache it has appended to
        # already; a qv call whose q and qv were two tensors, as [qv | q]) run in one C
        # function when the call is plain.
        if reads_only:
            result = plain_cache_call(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens,
                                      page_table, options, sinks, splits,
                                      bool(return_softmax_lse), scales)
        if result is not None:
            out, lse = result
        else:
            out, lse = kvcache_general(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                       cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
                                       cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, options,
                                       rotary_interleaved, chunk, sinks, splits, scales)
    if plan is not None:
        plan.finish()
    if float8_q:
        out = out.to(torch.bfloat16)
    if return_softmax_lse:
        return (out, lse) + empty_accumulators(out)
    return out


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: torch.Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3's scheduler precomputation, which anyattn does not need.

    Returns an empty int32 tensor on cache_seqlens' device: flash_attn_with_kvcache accepts it as
    scheduler_metadata and ignores it (anyattn plans each call itself). The arguments are
    accepted as FA3 names them and not used.
    """
    device = cache_seqlens.device if isinstance(cache_seqlens, torch.Tensor) else "cpu"
    return torch.empty((0,), dtype=torch.int32, device=device)
