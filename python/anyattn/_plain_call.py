"""Plain CPU torch calls, each run in one C function (python/src/torch_plain_call.cc).

``flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache``, and the FA3/FA4
cache calls with packed queries, first hand their arguments to ``_core.fwd_torch_plain``,
``_core.fwd_varlen_torch_plain``, ``_core.fwd_kvcache_torch_plain`` or
``_core.fwd_kvcache_varlen_torch_plain``, which run a plain call (exact CPU ``torch.Tensor``
inputs, no gradient to record, per-head tensors and cache scales in float32 only, simple option
values) and return None for anything else, changing nothing; the caller then takes its
ordinary path. This module hands the C side the torch objects it compares against, once, and
provides the one guard every caller tests first: ``tracing()``, true under torch.compile (whose
tracer must see the ordinary path, through the ``anyattn::`` ops) and always true without
torch.
"""

from __future__ import annotations

import os

from . import _core
from ._tensors import torch_module

_torch = torch_module()

if _torch is not None:
    _core.bind_torch(_torch.Tensor, _torch.float32, _torch.float16, _torch.bfloat16, _torch.int32,
                     getattr(_torch, "float8_e4m3fn", None), getattr(_torch, "float8_e5m2", None),
                     _torch.int8, _torch.is_grad_enabled)
    tracing = _torch.compiler.is_compiling
    # Run the library's parallel phases on torch's OpenMP team (python/src/host_openmp.cc): its
    # workers spin for a while after each torch op, and the library's own pool would compete with
    # them for the cores. Under OMP_WAIT_POLICY=PASSIVE they sleep instead, and the team would
    # only add a wake-up to every call, so the pool stays. ANYATTN_HOST_OPENMP=0 keeps the pool
    # and =1 takes the team, whatever the policy.
    choice = os.environ.get("ANYATTN_HOST_OPENMP", "")
    passive = os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"
    if choice != "0" and (choice == "1" or not passive):
        _core.use_host_openmp(True)
else:
    def tracing() -> bool:
        """Without torch there is no plain torch call: always take the ordinary path."""
        return True


def float32_per_head(x):
    """A per-head tensor (sinks, ALiBi slopes) as the plain C calls take it: float32 without
    autograd history, made from a floating-point CPU torch tensor that records no gradient
    (gpt-oss keeps its sinks in a bfloat16 Parameter), as the ordinary path converts it;
    anything else unchanged, for the C call to decline and the ordinary path to judge."""
    if (_torch is not None and isinstance(x, _torch.Tensor) and x.is_cpu
            and x.is_floating_point() and not (x.requires_grad and _torch.is_grad_enabled())):
        return x.detach().to(_torch.float32)
    return x
