"""The 8-bit cache arguments of the cache calls: which cache dtypes they take, and the checks and
conversions of k_descale / v_descale / k_token_scale / v_token_scale before the C call.

The C library validates everything again (values included); the checks here exist to name the
Python argument, its value and what is supported before any tensor reaches the C ABI, and to put
the scales in the form the ABI reads (float32 CPU tensors). The device routes, which make no C
call, check the descale values here too (check_descale_values). The quantization rule itself lives
in kv_quant.py and in the C library.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

from ._tensors import torch_module


class CacheScales(NamedTuple):
    """The checked scales of an 8-bit cache call (float32 CPU tensors or None)."""

    k_descale: Any
    v_descale: Any
    k_token_scale: Any
    v_token_scale: Any


def is_8bit(x: Any) -> bool:
    """True if ``x`` is a torch tensor of an 8-bit cache dtype."""
    torch = torch_module()
    if torch is None or not isinstance(x, torch.Tensor):
        return False
    from .kv_quant import QMAX  # noqa: PLC0415 - kv_quant needs torch
    return x.dtype in QMAX


def reject_q_descale(q_descale: Any) -> None:
    """q_descale must be None in anyattn's own cache calls, whose q is float32/float16/bfloat16."""
    if q_descale is not None:
        raise NotImplementedError(
            "q_descale: not supported by anyattn's own cache calls (q, the new keys/values and "
            "out are float32, float16 or bfloat16; only the KV cache may be 8-bit, read through "
            "k_descale/v_descale; anyattn.fa3_interface takes float8 q with q_descale); got "
            f"{_describe(q_descale)}, pass q_descale=None")


def _describe(value: Any) -> str:
    torch = torch_module()
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


def _descale(x: Any, name: str, hk: int, batch: int):
    """A descale as a float32 CPU tensor (1,), (Hk,) or (B, Hk); floats become (1,)."""
    torch = torch_module()
    if x is None:
        return None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        x = torch.tensor([float(x)], dtype=torch.float32)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 tensor or a float, got {_describe(x)}")
    if not x.is_floating_point() or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; descales are float32 "
                        "(float16/bfloat16/float64 are converted)")
    if x.dim() == 0:
        x = x.reshape(1)
    if tuple(x.shape) not in ((1,), (hk,), (batch, hk)):
        raise ValueError(f"{name}: shape {tuple(x.shape)} is not supported; expected (1,) per "
                         f"tensor, (Hk,) = ({hk},) per kv head or (B, Hk) = ({batch}, {hk}) per "
                         "sequence and kv head")
    return x.detach().to(device="cpu", dtype=torch.float32).contiguous()


def _token_scale(x: Any, name: str, cache: Any, cache_name: str):
    """A token scale: float32 of shape cache.shape[:3] on the cache's device, used in place."""
    torch = torch_module()
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 tensor, got {_describe(x)}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; token scales are float32 "
                        "(the call writes the new positions' scales into them in place)")
    expected = tuple(cache.shape[:3])
    if tuple(x.shape) != expected:
        raise ValueError(f"{name}: shape {tuple(x.shape)} does not match {cache_name}: expected "
                         f"{expected}, one scale per (cache position, kv head)")
    if x.device != cache.device:
        raise ValueError(f"{name}: on {x.device}, but {cache_name} is on {cache.device}")
    return x


def is_shared_latent(k_cache, v_cache) -> bool:
    """Whether v_cache is a column view of k_cache (same storage start and strides, Dv <= D)."""
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride() == k_cache.stride()
            and tuple(v_cache.shape[:3]) == tuple(k_cache.shape[:3])
            and v_cache.shape[3] <= k_cache.shape[3])


def cache_scales(k_cache, v_cache, batch: int, k_descale=None, v_descale=None,
                 k_token_scale=None, v_token_scale=None) -> Optional[CacheScales]:
    """The checked scales of a cache call, or None for a float cache without any.

    ``batch`` is the number of sequences (q's batch), which indexes (B, Hk) descales.
    Raises TypeError/ValueError naming the argument, its value and what is supported.
    """
    given = {"k_descale": k_descale, "v_descale": v_descale, "k_token_scale": k_token_scale,
             "v_token_scale": v_token_scale}
    if not is_8bit(k_cache) and not is_8bit(v_cache):
        for name, value in given.items():
            if value is not None:
                raise ValueError(
                    f"{name}: given for a {str(k_cache.dtype).replace('torch.', '')} KV cache; "
                    "scales read 8-bit caches only (torch.float8_e4m3fn, torch.float8_e5m2, "
                    "torch.int8)")
        return None
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache, v_cache: an 8-bit cache needs one dtype for both; got "
                        f"{k_cache.dtype} and {v_cache.dtype}")
    hk = k_cache.shape[2]
    if is_shared_latent(k_cache, v_cache):
        return _latent_scales(k_cache, batch, hk, k_descale, v_descale, k_token_scale,
                              v_token_scale)
    if (k_token_scale is None) != (v_token_scale is None):
        raise ValueError("k_token_scale, v_token_scale: give both or neither")
    return CacheScales(_descale(k_descale, "k_descale", hk, batch),
                       _descale(v_descale, "v_descale", hk, batch),
                       _token_scale(k_token_scale, "k_token_scale", k_cache, "k_cache"),
                       _token_scale(v_token_scale, "v_token_scale", v_cache, "v_cache"))


_LATENT_RULE = ("v_cache is a column view of k_cache (a shared latent cache), so its values are "
                "those of the K rows and take K's scales")


def _latent_scales(k_cache, batch, hk, k_descale, v_descale, k_token_scale, v_token_scale):
    """The scales of absorbed MLA's shared latent cache: V is the first Dv stored values of each
    K row, so it takes K's scales. Given V scales must be K's (equal descale values, the very
    token-scale tensor), as the C call requires, so that the device route reads V alike."""
    torch = torch_module()
    k = _descale(k_descale, "k_descale", hk, batch)
    v = _descale(v_descale, "v_descale", hk, batch)
    if v is not None and not torch.equal(_per_sequence(k, batch, hk), _per_sequence(v, batch, hk)):
        raise ValueError(f"v_descale: {_describe(v_descale)} differs from k_descale; "
                         f"{_LATENT_RULE}: pass v_descale=None")
    token = _token_scale(k_token_scale, "k_token_scale", k_cache, "k_cache")
    v_token = _token_scale(v_token_scale, "v_token_scale", k_cache, "k_cache")
    if v_token is not None and (token is None or v_token.data_ptr() != token.data_ptr()
                                or v_token.stride() != token.stride()):
        raise ValueError(f"v_token_scale: not k_token_scale itself; {_LATENT_RULE}: pass "
                         "v_token_scale=None")
    return CacheScales(k, k, token, token)


def _per_sequence(descale, batch: int, hk: int):
    """A checked descale (or None: 1) broadcast to (B, Hk)."""
    torch = torch_module()
    if descale is None:
        return torch.ones(batch, hk)
    return torch.broadcast_to(descale if descale.dim() == 2 else descale.reshape(1, -1),
                              (batch, hk))


def descale_rows(x: Any, name: str, hk: int, batch: int):
    """A descale ((1,), (Hk,) or (B, Hk); a float) as float32 (B, Hk) rows, checked: shape and
    dtype as _descale, values finite and >= 0. For descales that scale values in torch before the
    C call (FA3's q_descale), which the library therefore never sees."""
    torch = torch_module()
    rows = _per_sequence(_descale(x, name, hk, batch), batch, hk)
    bad = ~(torch.isfinite(rows) & (rows >= 0))
    if bool(bad.any()):
        b, h = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: entry ({b}, {h}) is {float(rows[b, h])}; supported: finite "
                         "values >= 0")
    return rows


def descales_by_sequence(scales: CacheScales, seq) -> CacheScales:
    """``scales`` with each (B, Hk) descale's rows picked by ``seq`` (a CPU index tensor: row i
    belongs to sequence seq[i]); per-tensor and per-head descales and token scales unchanged."""
    def pick(descale):
        if descale is None or descale.dim() != 2:
            return descale
        return descale.index_select(0, seq)
    return scales._replace(k_descale=pick(scales.k_descale), v_descale=pick(scales.v_descale))


def check_descale_values(scales: CacheScales, appending: bool) -> None:
    """The descale values the C library accepts, checked in Python for the device routes (the
    CPU calls leave this to the library, which gives the same rule): finite and >= 0 (0 reads
    the values as 0), and when new keys are appended (which divide by it) normal positive
    float32. Raises ValueError naming the argument, the entry and its value."""
    torch = torch_module()
    tiny = torch.finfo(torch.float32).tiny
    for name, descale in (("k_descale", scales.k_descale), ("v_descale", scales.v_descale)):
        if descale is None:
            continue
        bad = ~(torch.isfinite(descale) & (descale >= (tiny if appending else 0.0)))
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            value = float(descale[index])
            rule = ("appending (k, v given) divides by the descale, so it must be a normal "
                    f"positive float32 (>= {tiny})" if appending and math.isfinite(value)
                    and value >= 0.0 else "a descale must be finite and >= 0 (0 reads the "
                    "values as 0)")
            raise ValueError(f"{name}{list(index)} is {value}; {rule}")
