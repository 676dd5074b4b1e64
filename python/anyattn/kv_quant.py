"""8-bit KV caches: quantizing an existing cache, and reading one back.

anyattn's cache calls (``flash_attn_with_kvcache``, ``flash_attn_varlen_func`` with
``block_table``, FA3's ``flash_attn_with_kvcache``) take k_cache/v_cache of dtype
``torch.float8_e4m3fn``, ``torch.float8_e5m2`` or ``torch.int8``; a cached element's value is

    stored * descale * token_scale

with ``descale`` (``k_descale``/``v_descale``, float32) of shape (1,) per tensor, (Hk,) per kv head
or (B, Hk) per sequence and kv head (FlashAttention 3's layout), and ``token_scale``
(``k_token_scale``/``v_token_scale``, float32) one per (cache position, kv head): (B_cache,
S_cache, Hk), or (num_blocks, page_size, Hk) for a paged cache. A missing factor is 1. New keys
and values appended by the call are quantized by the C library (include/anyattn/anyattn.h):

    with token scales: token_scale = min(amax_row / (qmax * descale), FLT_MAX) rounded to
                       float32, 0 for a row without a finite non-zero element (which then
                       stores zeros); stored = Q(x / (descale * token_scale))
    without:           stored = Q(x / descale)

per (position, kv head) row, the quotients formed in float64 and rounded to float32, where Q rounds to nearest (ties to even) and saturates: int8 to
[-127, 127] (NaN -> 0), float8_e4m3fn to +-448, float8_e5m2 to +-57344 (NaN stays NaN).
``quantize_kv_cache`` applies exactly that rule, so a cache quantized here and one filled by
appends hold the same bytes for the same scales. Requires torch.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

# The 8-bit cache dtypes and their largest stored magnitude (qmax); int8 is symmetric.
QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.int8: 127.0}

GRANULARITIES = ("tensor", "head", "sequence", "token")

_FLT_MAX = torch.finfo(torch.float32).max
_FLT_MIN = torch.finfo(torch.float32).tiny


class QuantizedKVCache(NamedTuple):
    """An 8-bit cache and the scales that read it; pass ``cache`` as k_cache (or v_cache),
    ``descale`` as k_descale (v_descale) and ``token_scale`` as k_token_scale (v_token_scale)."""

    cache: torch.Tensor                   # same shape as the input, 8-bit dtype
    descale: Optional[torch.Tensor]       # float32 (1,), (Hk,) or (B, Hk); None = 1
    token_scale: Optional[torch.Tensor]   # float32 cache.shape[:3], or None


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_cache_dtype(dtype, name: str) -> float:
    """qmax of an 8-bit cache dtype; TypeError naming ``name`` and the supported dtypes otherwise."""
    if dtype not in QMAX:
        raise TypeError(f"{name}: {dtype!r} is not an 8-bit cache dtype; supported: "
                        + ", ".join(f"torch.{_dtype_name(d)}" for d in QMAX))
    return QMAX[dtype]


def round_to_cache(scaled: torch.Tensor, dtype) -> torch.Tensor:
    """Q: float32 values rounded to nearest (ties to even) and saturated into ``dtype``.

    int8 saturates to the symmetric [-127, 127] and maps NaN to 0; the float8 types saturate to
    their largest finite value (infinities too) and keep NaN.
    """
    qmax = QMAX[dtype]
    if dtype == torch.int8:
        return torch.round(torch.nan_to_num(scaled, nan=0.0)).clamp(-qmax, qmax).to(torch.int8)
    return scaled.clamp(-qmax, qmax).to(dtype)  # clamp keeps NaN; the cast rounds to nearest even


def _finite_amax(x: torch.Tensor, dims) -> torch.Tensor:
    """max |x| over ``dims`` ignoring inf and NaN (0 where nothing finite is left), float32."""
    a = x.abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype))
    return a.amax(dim=dims) if dims else a


def _group_descale(x: torch.Tensor, granularity: str, qmax: float) -> torch.Tensor:
    """The descale a granularity chooses: amax / qmax over its group (at least FLT_MIN, so that
    appends accept it), 1 for a group with nothing finite and non-zero."""
    dims = {"tensor": (0, 1, 2, 3), "head": (0, 1, 3), "sequence": (1, 3)}[granularity]
    amax = _finite_amax(x, dims).reshape(-1) if granularity == "tensor" else _finite_amax(x, dims)
    scale = (amax / qmax).clamp_min(_FLT_MIN)
    return torch.where(amax > 0, scale, torch.ones((), dtype=torch.float32))


def _broadcast_descale(descale: torch.Tensor, hk: int) -> torch.Tensor:
    """A (1,), (Hk,) or (B, Hk) descale shaped to broadcast over (B, S, Hk, 1)."""
    if descale.dim() == 1 and descale.shape[0] == 1:
        return descale.reshape(1, 1, 1, 1)
    if descale.dim() == 1:
        return descale.reshape(1, 1, hk, 1)
    return descale[:, None, :, None]


def _checked_descale(descale, cache: torch.Tensor, name: str) -> torch.Tensor:
    """A user-given descale as float32 (1,), (Hk,) or (B, Hk) on the cache's device."""
    b, _, hk, _ = cache.shape
    if not isinstance(descale, torch.Tensor):
        descale = torch.tensor([float(descale)])
    descale = descale.to(device=cache.device, dtype=torch.float32)
    if descale.dim() == 0:
        descale = descale.reshape(1)
    if tuple(descale.shape) not in ((1,), (hk,), (b, hk)):
        raise ValueError(f"{name}: shape {tuple(descale.shape)} is not supported; expected (1,), "
                         f"(Hk,) = ({hk},) or (B, Hk) = ({b}, {hk})")
    if not bool(torch.all(torch.isfinite(descale) & (descale >= _FLT_MIN))):
        raise ValueError(f"{name}: every entry must be a finite normal positive float32 "
                         f"(>= {_FLT_MIN}); got {descale.tolist()[:8]}")
    return descale


def quantize_kv_cache(cache: torch.Tensor, dtype, granularity: str = "token", *,
                      descale=None) -> QuantizedKVCache:
    """Quantize a float32/float16/bfloat16 KV cache to 8 bits, with the scales that read it.

    Arguments:
        cache: (B_cache, S_cache, Hk, D), or a paged cache (num_blocks, page_size, Hk, D) (every
            granularity but "sequence" treats both alike). Not modified.
        dtype: torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8.
        granularity: how many scales:
            "tensor"   one descale (1,) for the whole cache;
            "head"     one descale per kv head (Hk,);
            "sequence" one descale per (cache batch, kv head) (B_cache, Hk), FlashAttention 3's
                       k_descale layout; it is indexed by the query's batch index, so use it with
                       a contiguous cache read without cache_batch_idx;
            "token"    one token_scale per (position, kv head), cache.shape[:3], the finest and
                       the one that keeps values appended later as accurate as the rest (the
                       call computes new positions' scales itself); ``descale`` (default 1)
                       multiplies them.
            The coarse scales are amax / qmax of their group, so later appends of larger values
            saturate; pass ``descale`` with headroom (or use "token") for a cache that grows.
        descale: optional float or float32 tensor of the granularity's shape ((1,) or (Hk,) or
            (B, Hk); for "token" any of these) to quantize with instead of the computed one:
            finite, >= FLT_MIN.
    Returns:
        QuantizedKVCache(cache, descale, token_scale): for "token", descale is the given one (or
        None) and token_scale float32 cache.shape[:3]; otherwise token_scale is None.
    Raises:
        TypeError for a cache or dtype anyattn does not quantize; ValueError for a granularity or
        descale it does not support, each naming the argument, the value and what is supported.
    """
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache: expected a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"cache: dtype {cache.dtype} is not supported; quantize a float32, "
                        "float16 or bfloat16 cache")
    if cache.dim() != 4:
        raise ValueError(f"cache: expected (batch_cache, seqlen_cache, nheads_k, headdim) or "
                         f"(num_blocks, page_size, nheads_k, headdim), got {tuple(cache.shape)}")
    qmax = check_cache_dtype(dtype, "dtype")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: {granularity!r} is not supported; use one of "
                         f"{', '.join(repr(g) for g in GRANULARITIES)}")
    x = cache.detach()
    hk = x.shape[2]
    if granularity == "token":
        given = None if descale is None else _checked_descale(descale, x, "descale")
        stored, token = quantize_rows(x, dtype, given, token_scales=True)
        return QuantizedKVCache(stored, given, token)
    if descale is None:
        chosen = _group_descale(x.float(), granularity, qmax)
    else:
        chosen = _checked_descale(descale, x, "descale")
        expected = {"tensor": (1,), "head": (hk,), "sequence": (x.shape[0], hk)}[granularity]
        if tuple(chosen.shape) != expected:
            raise ValueError(f"descale: shape {tuple(chosen.shape)} does not match granularity "
                             f"{granularity!r}, which expects {expected}")
    stored, _ = quantize_rows(x, dtype, chosen, token_scales=False)
    return QuantizedKVCache(stored, chosen, None)


def quantize_rows(x: torch.Tensor, dtype, descale: Optional[torch.Tensor],
                  token_scales: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The C library's quantization of rows x (B, S, Hk, D) (any float dtype) into an 8-bit
    ``dtype``, as its cache append does (include/anyattn/anyattn.h): returns (stored, token scales
    (B, S, Hk) float32, or None without ``token_scales``). descale: float32 (1,), (Hk,) or (B, Hk)
    (indexed by x's first dimension), or None for 1. The quotients are formed in float64 (so ``x``
    must be on a device that has it; the CPU always does), clamped to +-2 qmax (saturation gives
    the same byte), rounded to float32, then Q (round_to_cache)."""
    qmax = QMAX[dtype]
    x = x.to(torch.float64)
    d = (torch.ones((1, 1, 1, 1), dtype=torch.float64, device=x.device) if descale is None
         else _broadcast_descale(descale.to(x.device), x.shape[2]).double())
    if not token_scales:
        return _stored(x / d, dtype, qmax), None
    amax = _finite_amax(x, (3,))[..., None]                      # (B, S, Hk, 1)
    token = (amax / (qmax * d)).clamp_max(_FLT_MAX).to(torch.float32)
    token64 = token.double()
    quotient = torch.where(token64 > 0, x / (d * token64), torch.zeros((), dtype=x.dtype))
    return _stored(quotient, dtype, qmax), token[..., 0].contiguous()


def _stored(quotient: torch.Tensor, dtype, qmax: float) -> torch.Tensor:
    """Q of float64 quotients: clamped to +-2 qmax, rounded to float32, then round_to_cache."""
    return round_to_cache(quotient.clamp(-2 * qmax, 2 * qmax).to(torch.float32), dtype)


def dequantize_kv_cache(cache: torch.Tensor, descale=None, token_scale=None,
                        dtype=torch.float32) -> torch.Tensor:
    """The values an 8-bit cache holds, ``stored * (descale * token_scale)`` in float32 (the
    factor formed first, as the kernels do), cast to ``dtype``: what the cache calls attend to.
    descale (1,), (Hk,) or (B, Hk) (the last read by cache batch, i.e. a cache read without
    cache_batch_idx or block_table); token_scale cache.shape[:3]. A float cache without scales
    is returned as ``dtype``."""
    x = cache.to(torch.float32)
    factor = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=x.device)
    if descale is not None:
        d = descale if isinstance(descale, torch.Tensor) else torch.tensor([float(descale)])
        d = d.to(device=x.device, dtype=torch.float32)
        factor = _broadcast_descale(d.reshape(1) if d.dim() == 0 else d, x.shape[2])
    if token_scale is not None:
        factor = factor * token_scale.to(device=x.device, dtype=torch.float32)[..., None]
    return (x * factor).to(dtype)
