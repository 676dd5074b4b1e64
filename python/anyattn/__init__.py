"""anyattn: exact attention with FlashAttention 2.x semantics on any device.

Drop-in for flash-attn's dense API: ``from anyattn import flash_attn_func``. numpy arrays and CPU
torch tensors run anyattn's own C++ kernels; tensors on other devices go to flash_attn or torch
SDPA (see ``anyattn.backends()`` and docs/python.md).
"""

from . import _core
from ._flash_attn_compat import install_as_flash_attn
from ._info import backends, get_num_threads, isa, set_num_threads
from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
)
from .kvcache import flash_attn_with_kvcache
from .merge import merge_attention_states, merge_attention_states_
from ._tensors import torch_module as _torch_module
from .varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

if _torch_module() is not None:  # 8-bit KV caches are torch tensors
    from .kv_quant import QuantizedKVCache, dequantize_kv_cache, quantize_kv_cache

__version__ = _core.version_string()

__all__ = [
    "QuantizedKVCache",
    "__version__",
    "backends",
    "dequantize_kv_cache",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "get_num_threads",
    "install_as_flash_attn",
    "isa",
    "merge_attention_states",
    "merge_attention_states_",
    "quantize_kv_cache",
    "set_num_threads",
]
if _torch_module() is None:
    __all__ = [name for name in __all__
               if name not in ("QuantizedKVCache", "dequantize_kv_cache", "quantize_kv_cache")]
