"""FlashAttention 3's FP8 call style: float8 q, k and v with per-(sequence, kv head) descales.

FA3 takes ``torch.float8_e4m3fn`` q, k and v with ``q_descale``, ``k_descale`` and ``v_descale``
of shape (batch, nheads_k), and returns bfloat16; serving engines also pass float8 q against a
float8 KV cache (sglang's FA3 backend casts q to the cache's dtype). The scores are softmax_scale
* (q * q_descale) . (k * k_descale) and the output P (v * v_descale). anyattn computes that
attention over the dequantized values with P in float32 (FA3 rounds P to float8 for its P V
product):

- q: float8 values are bfloat16 values exactly (2 or 3 mantissa bits, exponents within
  bfloat16's range), so q runs as bfloat16. q_descale joins k_descale (their product, one float32
  rounding) in the dense and varlen calls; in the cache call, which may append keys quantized by
  k_descale, q runs as q * q_descale in float32 instead (one rounding per element), each
  sequence's descale row for its rows.
- k, v: read in place as an 8-bit cache of the library, k_descale and v_descale being its
  descales (docs/kvcache_8bit.md): batched q against batched or paged keys through one plain
  cache call; packed q or keys through the packed-query cache call, packed keys as one cache
  row that each sequence reads from its own first key.
- out: bfloat16; the LSE float32.

As in FA3 there is no backward: a backward through these calls raises NotImplementedError.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _core
from ._fa_plan import (Seqs, forget_unused_rows, key_extents, paged_keys, plan_subsequences,
                       query_extents, run_cache, unpack)
from ._kv_scales import cache_scales, descale_rows
from ._options import AttnOptions
from ._segments import segment_positions
from .kvcache import flash_attn_with_kvcache as _plain_cache_call

FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_float8(x: Any) -> bool:
    """True if ``x`` is a torch tensor of one of FA3's float8 dtypes."""
    return isinstance(x, torch.Tensor) and x.dtype in FLOAT8_DTYPES


_WIDENING_TABLES = {}  # (float8 dtype, wider dtype) -> the 256 values of the float8 codes


def widened(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float8 ``x`` as ``dtype`` (bfloat16 or float32; exact), through a table of the 256 codes'
    values: on CPU to bfloat16 by _core.widen_codes (one table load per code), else by
    torch.take. A tensor that requires grad takes torch's conversion, which autograd follows (to
    the cache call, whose backward raises NotImplementedError)."""
    if x.requires_grad and torch.is_grad_enabled():
        return x.to(dtype)
    key = (x.dtype, dtype)
    if key not in _WIDENING_TABLES:
        _WIDENING_TABLES[key] = torch.arange(256, dtype=torch.uint8).view(x.dtype).to(dtype)
    codes = x.contiguous().view(torch.uint8)
    if x.device.type == "cpu" and dtype == torch.bfloat16:
        out = torch.empty(x.shape, dtype=dtype)
        _core.widen_codes(codes.data_ptr(), codes.numel(), _table_bytes(key), out.data_ptr())
        return out
    return _WIDENING_TABLES[key].to(x.device).take(codes.long())


_TABLE_BYTES = {}  # (float8 dtype, 16-bit dtype) -> the table's 512 bytes, for _core.widen_codes


def _table_bytes(key) -> bytes:
    if key not in _TABLE_BYTES:
        _TABLE_BYTES[key] = _WIDENING_TABLES[key].view(torch.int16).numpy().tobytes()
    return _TABLE_BYTES[key]


def _require_float8(x: torch.Tensor, name: str) -> None:
    if not is_float8(x):
        raise TypeError(f"{name}: dtype {x.dtype} in FA3's FP8 call style (float8 inputs or "
                        "descales given), which takes q, k and v in torch.float8_e4m3fn or "
                        "torch.float8_e5m2")


def _packed_queries(pq: torch.Tensor, q0: torch.Tensor, q_span: torch.Tensor, q_descale: Any,
                    nheads_k: int) -> torch.Tensor:
    """Packed float8 q (total, Hq, D), sequence b in rows q0[b] .. q0[b] + q_span[b] - 1, as the
    kernels take it: bfloat16, or q * q_descale in float32."""
    if q_descale is None:
        return widened(pq, torch.bfloat16)
    nheads = pq.shape[1]
    if nheads % nheads_k != 0:
        raise ValueError(f"q: {nheads} heads are not a multiple of the {nheads_k} kv heads")
    per_head = descale_rows(q_descale, "q_descale", nheads_k, q0.numel()).repeat_interleave(
        nheads // nheads_k, dim=1)  # (batch, Hq)
    seq, index = segment_positions(q_span)
    scale = torch.ones(pq.shape[0], nheads)  # rows outside every sequence: never read
    scale[q0[seq] + index] = per_head[seq]
    return widened(pq, torch.float32) * scale[:, :, None].to(pq.device)


def fp8_cache_queries(q: torch.Tensor, q_descale: Any, cu_seqlens_q: Any,
                      nheads_k: int) -> torch.Tensor:
    """Float8 q of a cache call (batched (B, Sq, Hq, D), or packed with cu_seqlens_q) in its own
    layout as the kernels take it: bfloat16, or q * q_descale in float32."""
    pq, q0, _, q_span, _ = query_extents(q, cu_seqlens_q, None)
    return _packed_queries(pq, q0, q_span, q_descale, nheads_k).reshape(q.shape)


def fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table,
                  options: AttnOptions, sinks, chunk: int, num_splits: int, q_descale,
                  k_descale, v_descale):
    """FA3's flash_attn_func / flash_attn_varlen_func with float8 q, k and v: (out, lse) in q's
    layout, out bfloat16: (total_q, Hq, Dv) and (Hq, total_q), or (B, Sq, Hq, Dv) and
    (B, Hq, Sq) for batched q. k/v: batched, packed with cu_seqlens_k, or paged with
    page_table."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _require_float8(x, name)
    if page_table is not None and cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k: must be None with page_table (the key counts come from "
                         "seqused_k, else every sequence has the page_table's full capacity)")
    pq, q0, q_used, q_span, q_end = query_extents(q, cu_seqlens_q, seqused_q)
    batch, hk = q0.numel(), k.shape[-2]
    if q_descale is not None:
        # These calls append nothing, so q's descale may join k's (one float32 rounding of the
        # product): q then runs as bfloat16, exactly, instead of as q * q_descale in float32.
        k_descale = (descale_rows(q_descale, "q_descale", hk, batch)
                     * descale_rows(1.0 if k_descale is None else k_descale, "k_descale", hk,
                                    batch))
    pq = _packed_queries(pq, q0, q_span, None, hk)
    if cu_seqlens_q is None and cu_seqlens_k is None and seqused_q is None and chunk == 0:
        # Batched q against batched or paged keys: the keys are the cache of one plain cache
        # call (faster than the packed-query cache call, which the other forms take).
        out, lse = _plain_cache_call(
            pq.reshape(q.shape), k, v, cache_seqlens=seqused_k,
            block_table=page_table, softmax_scale=options.softmax_scale, causal=options.causal,
            window_size=options.window_size, softcap=options.softcap, num_splits=num_splits,
            return_softmax_lse=True, sinks=sinks, k_descale=k_descale, v_descale=v_descale)
        return out.to(torch.bfloat16), lse
    if page_table is not None:
        table, k_used = paged_keys(page_table, k, batch, seqused_k)
        seqs = Seqs(q0, q_used, q_span, torch.zeros_like(q0), k_used, q_end, 0)
        k_cache, v_cache, batch_idx = k, v, None
    else:
        pk, pv, k0, k_used, k_end = key_extents(k, v, cu_seqlens_k, seqused_k, batch)
        seqs = Seqs(q0, q_used, q_span, k0, k_used, q_end, k_end)
        table, k_cache, v_cache = None, pk.unsqueeze(0), pv.unsqueeze(0)
        batch_idx = torch.zeros(batch, dtype=torch.int64)
    scales = cache_scales(k_cache, v_cache, batch, k_descale, v_descale)
    out, lse = run_cache(pq, k_cache, v_cache, plan_subsequences(seqs, chunk), table, batch_idx,
                         options, sinks, num_splits, scales)
    if seqused_q is not None and sinks is not None:
        lse = forget_unused_rows(lse, seqs)
    return unpack(out.to(torch.bfloat16), lse, q, cu_seqlens_q is None)
