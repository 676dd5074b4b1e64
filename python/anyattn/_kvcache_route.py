"""flash_attn_with_kvcache on devices without anyattn kernels: one call per call.

With the flash_attn package able to serve the call, its own flash_attn_with_kvcache runs it
(appending in place as anyattn's does). Otherwise, in torch and with no Python loop over the
batch or host synchronisation:
1. the new keys (rotated when rotary tables are given) and values are written into the caches at
   positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (contiguous caches through
   cache_batch_idx, paged caches through block_table);
2. each sequence's cache rows are gathered (the whole batch row, or its block_table pages), and
3. one attention runs over them with a per-sequence mask: keys cache_leftpad[b] ..
   cache_seqlens[b] + seqlen_new - 1, bottom-right aligned to that range (docs/varlen_kvcache.md),
   through SDPA when it expresses the call and no LSE is wanted, else _sdpa's f32 math path.
An 8-bit cache (float8_e4m3fn, float8_e5m2 or int8 with k_descale/v_descale and token scales)
takes the same steps: the new rows are quantized by the library's rule (kv_quant.quantize_rows, on
the CPU, where float64 is always at hand; the few new rows make the copies cheap) and written with
their token scales, and the gathered rows are dequantized to q's dtype before the attention
(stored * (descale * token_scale), the factor formed in float32 first, as the CPU kernels read it).
The gather copies the referenced cache rows once per call: this route serves correctness on
devices that have no kernel, not speed.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _dispatch, _sdpa
from ._kv_scales import CacheScales, check_descale_values, is_shared_latent
from ._options import AttnOptions
from .kv_quant import dequantize_kv_cache, quantize_rows


class CacheCall(NamedTuple):
    """The cache arguments of a flash_attn_with_kvcache call, as given (tensors or None)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k: Optional[torch.Tensor]
    v: Optional[torch.Tensor]
    rotary_cos: Optional[torch.Tensor]
    rotary_sin: Optional[torch.Tensor]
    cache_seqlens: Optional[torch.Tensor]
    cache_seqlen: int  # the int form of cache_seqlens, or -1
    cache_batch_idx: Optional[torch.Tensor]
    cache_leftpad: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    rotary_interleaved: bool
    scales: Optional[CacheScales] = None  # an 8-bit cache's scales (_kv_scales.cache_scales)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
           dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x (..., S, H, D) rotated by cos/sin (..., S, rotary_dim / 2) in float32, rounded once to
    ``dtype`` (default: x's dtype).

    The first rotary_dim features rotate in pairs (GPT-J's adjacent pairs when ``interleaved``,
    else GPT-NeoX's halves); the rest pass through.
    """
    rd = cos.shape[-1] * 2
    xf = x.float()
    c, s = cos.float()[..., None, :], sin.float()[..., None, :]
    if interleaved:
        x0, x1 = xf[..., 0:rd:2], xf[..., 1:rd:2]
    else:
        x0, x1 = xf[..., : rd // 2], xf[..., rd // 2: rd]
    r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
    rot = torch.stack((r0, r1), dim=-1).flatten(-2) if interleaved else torch.cat((r0, r1), -1)
    return torch.cat((rot, xf[..., rd:]), dim=-1).to(dtype or x.dtype)


def _stored_lengths(call: CacheCall, batch: int, device) -> torch.Tensor:
    """(batch,) int64: keys already in each sequence's cache before the append."""
    if call.cache_seqlens is not None:
        return call.cache_seqlens.to(device=device, dtype=torch.int64)
    s_new = 0 if call.k is None else call.k.shape[1]
    stored = call.cache_seqlen if call.cache_seqlen >= 0 else call.k_cache.shape[1] - s_new
    return torch.full((batch,), stored, dtype=torch.int64, device=device)


def _cache_index(call: CacheCall, positions: torch.Tensor):
    """(dim-0, dim-1) cache indices of positions (batch, n), through block_table or cache_batch_idx."""
    batch = positions.shape[0]
    if call.block_table is not None:
        page = call.k_cache.shape[1]
        table = call.block_table.to(device=positions.device, dtype=torch.int64)
        return torch.gather(table, 1, positions // page), positions % page
    if call.cache_batch_idx is not None:
        rows = call.cache_batch_idx.to(device=positions.device, dtype=torch.int64)
    else:
        rows = torch.arange(batch, device=positions.device)
    return rows[:, None].expand_as(positions), positions


def _append(call: CacheCall, stored: torch.Tensor) -> None:
    """Write the new keys (rotated) and values into the caches in place (an 8-bit cache: quantized,
    with their token scales)."""
    s_new = call.k.shape[1]
    positions = stored[:, None] + torch.arange(s_new, device=stored.device)[None, :]
    keys = call.k
    if call.rotary_cos is not None:
        # An 8-bit cache quantizes the rotated float32 values, as the library does.
        keys = rotate(keys, call.rotary_cos[positions], call.rotary_sin[positions],
                      call.rotary_interleaved, torch.float32 if call.scales else None)
    block, row = _cache_index(call, positions)
    if call.scales is None:
        call.k_cache[block, row] = keys.to(call.k_cache.dtype)
        call.v_cache[block, row] = call.v.to(call.v_cache.dtype)
    else:
        store_quantized((block, row), keys, call.v, call.scales, call.k_cache, call.v_cache)


def store_quantized(index, keys: torch.Tensor, values: torch.Tensor, scales: CacheScales,
                    k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Quantize new rows (N, S, Hk, D) into 8-bit caches at ``index`` (a (block, row) pair of
    (N, S) index tensors on the caches' device), writing their token scales too where the cache
    has them; a (B, Hk) descale's rows are the N rows'. The library's rule
    (kv_quant.quantize_rows) runs on the CPU, where float64 is always at hand. A shared latent
    cache (v_cache a column view of k_cache) holds each row once: the keys' write is all, as in
    the library (its V takes K's scales, and its token scale K's amax over all D columns)."""
    streams = [(k_cache, keys, scales.k_descale, scales.k_token_scale)]
    if not is_shared_latent(k_cache, v_cache):
        streams.append((v_cache, values, scales.v_descale, scales.v_token_scale))
    for cache, new, descale, token_scale in streams:
        stored, token = quantize_rows(new.detach().cpu(), cache.dtype, descale,
                                      token_scales=token_scale is not None)
        cache[index] = stored.to(cache.device)
        if token_scale is not None:
            token_scale[index] = token.to(token_scale.device)


def _gathered_rows(call: CacheCall, x: Optional[torch.Tensor], batch: int, device):
    """Each sequence's rows of ``x`` (a cache, or its token scales): (batch, capacity, ...)."""
    if x is None:
        return None
    if call.block_table is not None:
        table = call.block_table.to(device=device, dtype=torch.int64)
        pages = x[table]
        return pages.reshape(batch, -1, *pages.shape[3:])
    if call.cache_batch_idx is not None:
        return x[call.cache_batch_idx.to(device=device, dtype=torch.int64)]
    return x[:batch]


def _gathered(call: CacheCall, batch: int, device, dtype: torch.dtype):
    """Each sequence's cache rows: (keys, values) of shape (batch, capacity, Hk, D[v]); an 8-bit
    cache's dequantized to ``dtype`` (its (B, Hk) descales index the sequences, as in the
    kernels)."""
    keys = _gathered_rows(call, call.k_cache, batch, device)
    values = _gathered_rows(call, call.v_cache, batch, device)
    if call.scales is None:
        return keys, values
    s = call.scales
    return (dequantize_kv_cache(keys, s.k_descale,
                                _gathered_rows(call, s.k_token_scale, batch, device), dtype),
            dequantize_kv_cache(values, s.v_descale,
                                _gathered_rows(call, s.v_token_scale, batch, device), dtype))


def _query_rotation(q, call: CacheCall, stored: torch.Tensor, options: AttnOptions):
    """q rotated at its absolute positions: stored[b] + i when causal or windowed, else
    stored[b] for every row (flash-attn's convention)."""
    if call.rotary_cos is None:
        return q
    sq = q.shape[1]
    per_row = options.causal or options.window_size != (-1, -1)
    offsets = torch.arange(sq, device=q.device)[None, :] if per_row else torch.zeros(
        (1, sq), dtype=torch.int64, device=q.device)
    positions = stored[:, None] + offsets
    return rotate(q, call.rotary_cos[positions], call.rotary_sin[positions], call.rotary_interleaved)


def kvcache_on_device(q, call: CacheCall, options: AttnOptions, alibi_slopes, sinks,
                      num_splits: int, want_lse: bool):
    """flash_attn_with_kvcache on torch tensors off the CPU: (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)
    or None when not wanted and the backend gives none). Appends to the caches in place."""
    b, sq, hq, d = q.shape
    call_features = _dispatch.CallFeatures(
        dtype=str(q.dtype).replace("torch.", ""), head_dim=d, head_dim_v=call.v_cache.shape[-1],
        softcap=options.softcap > 0.0, alibi=alibi_slopes is not None,
        window=options.has_window(), sinks=sinks is not None, return_lse=want_lse,
        paged_block_size=0 if call.block_table is None else call.k_cache.shape[1],
        kv8=call.scales is not None)
    choice = _dispatch.select_backend(q.device.type, call_features,
                                      _dispatch.probe_environment(q.device))
    _dispatch.log_fallback_once(q.device.type, choice)
    if choice.backend == _dispatch.FLASH_ATTN:
        return _flash_attn_kvcache(q, call, options, alibi_slopes, num_splits)

    if call.scales is not None:
        check_descale_values(call.scales, appending=call.k is not None)
    stored = _stored_lengths(call, b, q.device)
    if call.k is not None:
        _append(call, stored)
    q = _query_rotation(q, call, stored, options)
    keys, values = _gathered(call, b, q.device, q.dtype)
    s_new = 0 if call.k is None else call.k.shape[1]
    end = stored + s_new  # one past each sequence's last key
    start = (torch.zeros_like(end) if call.cache_leftpad is None
             else call.cache_leftpad.to(device=q.device, dtype=torch.int64))
    capacity = keys.shape[1]
    j = torch.arange(capacity, device=q.device)[None, None, :]   # (1, 1, L)
    diag = torch.arange(sq, device=q.device)[None, :, None] + (end - sq)[:, None, None]  # (B, Sq, 1)
    left, right = options.effective_window()
    visible = ((j >= start[:, None, None]) & (j < end[:, None, None])).expand(b, sq, capacity)
    if left >= 0:
        visible = visible & (j >= diag - left)
    if right >= 0:
        visible = visible & (j <= diag + right)
    visible = visible[:, None]  # (B, 1, Sq, L)
    why_math = _sdpa.needs_math(options, q.dtype, alibi_slopes is not None, sinks is not None,
                                want_lse)
    if why_math is None:
        out = _sdpa.sdpa_with_mask(q, keys, values, options, visible)
        return out, None
    bias = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(torch.float32)
        slopes = slopes[None, :] if slopes.dim() == 1 else slopes
        distance = (diag - j).abs().to(torch.float32)[:, None]  # (B, 1, Sq, L)

        def alibi(lo, hi):
            return -slopes[:, :, None, None] * distance[:, :, lo:hi]

        bias = alibi
    return _sdpa.masked_math_attention(q, keys, values, options, sinks,
                                       lambda lo, hi: visible[:, :, lo:hi], bias)


def _flash_attn_kvcache(q, call: CacheCall, options: AttnOptions, alibi_slopes, num_splits):
    """The real flash_attn.flash_attn_with_kvcache with the same arguments: (out, lse)."""
    from flash_attn import flash_attn_with_kvcache  # noqa: PLC0415 - optional dependency

    from ._flash_attn_compat import original_function  # noqa: PLC0415

    cache_seqlens = call.cache_seqlens
    if cache_seqlens is None and call.cache_seqlen >= 0:
        cache_seqlens = call.cache_seqlen
    out, lse = original_function(flash_attn_with_kvcache)(
        q, call.k_cache, call.v_cache, k=call.k, v=call.v, rotary_cos=call.rotary_cos,
        rotary_sin=call.rotary_sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=call.cache_batch_idx, cache_leftpad=call.cache_leftpad,
        block_table=call.block_table, softmax_scale=options.softmax_scale, causal=options.causal,
        window_size=options.window_size, softcap=options.softcap,
        rotary_interleaved=call.rotary_interleaved, alibi_slopes=alibi_slopes,
        num_splits=num_splits, return_softmax_lse=True)
    return out, lse
