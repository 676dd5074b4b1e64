"""Which backend runs a call: a pure decision function, plus the probes that feed it.

Rules (docs/python.md, "Device dispatch"):
- numpy arrays and CPU torch tensors: anyattn's own kernels.
- CUDA tensors: the ``flash_attn`` package when it is installed and supports the call; otherwise
  torch SDPA with an equivalent mask, or the f32 math path where SDPA cannot express the call.
- Any other device (mps, xpu, ...): SDPA or the math path, as for CUDA without flash_attn.
No call ever fails for want of a device backend. Falling back is logged once per (device, backend,
reason) at debug level on the ``anyattn`` logger.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple, Optional, Tuple

ANYATTN = "anyattn"
FLASH_ATTN = "flash_attn"
SDPA = "sdpa"
MATH = "torch_math"

_LOGGER = logging.getLogger("anyattn")
_LOGGED = set()


class CallFeatures(NamedTuple):
    """What a call asks for, as far as backend selection cares."""

    dtype: str  # "float32", "float16" or "bfloat16"
    head_dim: int
    head_dim_v: int
    dropout: bool = False
    softcap: bool = False
    alibi: bool = False
    window: bool = False
    sinks: bool = False
    return_lse: bool = False
    seqused_k: bool = False  # varlen keys limited per sequence (flash_attn's public API lacks it)
    paged_block_size: int = 0  # the page size of a paged KV cache, 0 when not paged
    kv8: bool = False  # an 8-bit KV cache (float8_e4m3fn, float8_e5m2, int8) with its scales


class Environment(NamedTuple):
    """What is installed: flash_attn's version (None if absent) and the CUDA device's capability."""

    flash_attn_version: Optional[str] = None
    cuda_capability: Optional[Tuple[int, int]] = None


class Choice(NamedTuple):
    """The selected backend and a sentence saying why."""

    backend: str
    reason: str


def _version_tuple(version: str) -> Tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def flash_attn_unsupported(call: CallFeatures, env: Environment) -> Optional[str]:
    """Why the flash_attn package cannot run ``call`` on this CUDA device, or None if it can."""
    if env.flash_attn_version is None:
        return "the flash_attn package is not installed"
    if env.cuda_capability is None or env.cuda_capability < (8, 0):
        return f"flash_attn 2 needs compute capability >= 8.0, the device has {env.cuda_capability}"
    if call.dtype not in ("float16", "bfloat16"):
        return f"flash_attn supports float16/bfloat16 only, the call is {call.dtype}"
    if call.head_dim > 256 or call.head_dim_v != call.head_dim:
        return (f"flash_attn needs headdim <= 256 and equal q/v head dims, got "
                f"{call.head_dim}/{call.head_dim_v}")
    if call.sinks:
        return "flash_attn 2 has no attention sinks"
    if call.seqused_k:
        return "flash_attn's flash_attn_varlen_func has no seqused_k"
    if call.kv8:
        return "flash_attn 2 reads float16/bfloat16 KV caches only, the cache is 8-bit"
    if call.paged_block_size % 256:
        return f"flash_attn 2 needs pages of a multiple of 256 keys, the cache has {call.paged_block_size}"
    version = _version_tuple(env.flash_attn_version)
    for needed, minimum, what in ((call.window, (2, 3), "window_size"),
                                  (call.alibi, (2, 4), "alibi_slopes"),
                                  (call.softcap, (2, 6), "softcap")):
        if needed and version < minimum:
            return (f"flash_attn {env.flash_attn_version} lacks {what} "
                    f"(needs >= {'.'.join(map(str, minimum))})")
    return None


def _portable(call: CallFeatures, why_not_native: str) -> Choice:
    if call.softcap:
        return Choice(MATH, f"{why_not_native}; softcap is not expressible in SDPA, using the f32 math path")
    if call.return_lse:
        return Choice(MATH, f"{why_not_native}; SDPA returns no LSE, using the f32 math path")
    if (call.alibi or call.sinks) and call.dtype != "float32":
        return Choice(MATH, f"{why_not_native}; SDPA would round the ALiBi/sink bias to "
                            f"{call.dtype}, using the f32 math path")
    return Choice(SDPA, f"{why_not_native}; using torch SDPA with an equivalent bottom-right mask")


def select_backend(device_type: str, call: CallFeatures, env: Environment) -> Choice:
    """Pure function: the backend for a call of features ``call`` on ``device_type`` given ``env``."""
    if device_type == "cpu":
        return Choice(ANYATTN, "anyattn CPU kernels")
    if device_type == "cuda":
        why = flash_attn_unsupported(call, env)
        if why is None:
            return Choice(FLASH_ATTN, f"flash_attn {env.flash_attn_version} supports this call")
        return _portable(call, why)
    return _portable(call, f"anyattn has no kernels for device '{device_type}'")


def log_fallback_once(device_type: str, choice: Choice) -> None:
    """Log a non-native backend choice at debug level, once per (device, backend, reason)."""
    key = (device_type, choice.backend, choice.reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        _LOGGER.debug("anyattn: %s tensors -> %s (%s)", device_type, choice.backend, choice.reason)


@functools.lru_cache(maxsize=None)
def flash_attn_version() -> Optional[str]:
    """The installed flash_attn package's version, or None if it is absent or fails to import."""
    try:
        import flash_attn  # noqa: PLC0415 - optional dependency
    except Exception:  # any import failure (missing package, CUDA mismatch) means unusable
        return None
    if getattr(flash_attn, "__anyattn_shim__", False):  # anyattn's own stand-in (install_as_flash_attn)
        return None
    return str(getattr(flash_attn, "__version__", "0"))


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> Tuple[int, int]:
    import torch  # noqa: PLC0415

    return tuple(torch.cuda.get_device_capability(index))


def probe_environment(device=None) -> Environment:
    """The Environment for ``device`` (a torch.device): flash_attn's version and, for CUDA, the capability."""
    capability = None
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch  # noqa: PLC0415

        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = _cuda_capability(index)
    return Environment(flash_attn_version=flash_attn_version(), cuda_capability=capability)
