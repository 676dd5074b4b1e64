"""Process-level controls and introspection: threads, version, ISA and ``backends()``."""

from __future__ import annotations

from typing import Dict

from . import _core, _dispatch
from ._tensors import torch_module


def set_num_threads(n: int) -> None:
    """Set the threads anyattn's CPU kernels use, process-wide. ``n <= 0`` restores the default.

    The default is ``ANYATTN_NUM_THREADS`` if set, else the CPUs in the process's affinity mask.
    Results are bitwise identical for every thread count.
    """
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    """The number of threads later CPU calls will use."""
    return _core.get_num_threads()


def isa() -> str:
    """The instruction-set path anyattn's CPU kernels use here: "avx512_amx", "avx512", "avx2",
    "neon" or "portable"."""
    return _core.isa_default()


def _device_entry(device: str, flash_version) -> Dict[str, str]:
    """The backends() entry for "cuda" or "other" (non-CPU torch devices)."""
    if device == "cuda":
        if flash_version is None:
            return {"backend": "sdpa", "reason": "flash_attn is not installed: torch SDPA with an "
                    "equivalent bottom-right mask (the f32 math path for softcap, LSE output, or "
                    "ALiBi/sinks in half precision)"}
        return {"backend": "flash_attn", "reason": f"flash_attn {flash_version} for the calls it "
                "supports (f16/bf16, sm80+, no sinks); otherwise torch SDPA or the f32 math path"}
    return {"backend": "sdpa", "reason": "anyattn has no kernels for mps, xpu or other devices: torch SDPA with an "
            "equivalent bottom-right mask (the f32 math path for softcap, LSE output, or "
            "ALiBi/sinks in half precision)"}


def backends() -> Dict[str, Dict[str, str]]:
    """Which backend each kind of input would use, and why.

    Returns a dict keyed by ``"numpy"``, ``"cpu"``, ``"cuda"`` and ``"other"`` (mps, xpu, ...), each
    a dict with ``"backend"`` (``"anyattn"``, ``"flash_attn"``, ``"sdpa"`` or ``"unavailable"``),
    ``"reason"``, and for the anyattn entries ``"isa"`` and ``"threads"``. Where the choice depends
    on the call (e.g. softcap on CUDA), the reason says how; ``anyattn._dispatch.select_backend`` is
    the exact rule.
    """
    native = {"backend": "anyattn", "isa": isa(), "threads": str(get_num_threads())}
    result = {"numpy": dict(native, reason="anyattn CPU kernels (float32/float16 arrays)")}
    torch = torch_module()
    if torch is None:
        missing = {"backend": "unavailable", "reason": "torch is not installed (pip install anyattn[torch])"}
        result.update(cpu=missing, cuda=dict(missing), other=dict(missing))
        return result
    result["cpu"] = dict(native, reason=f"anyattn CPU kernels via torch.ops.anyattn.fwd (torch {torch.__version__})")
    flash_version = _dispatch.flash_attn_version()
    cuda = _device_entry("cuda", flash_version)
    if not torch.cuda.is_available():
        cuda["reason"] += "; note: torch sees no CUDA device in this process"
    result["cuda"] = cuda
    result["other"] = _device_entry("other", flash_version)
    return result
