"""sglang plugin: ``--mm-attention-backend anyattn``, and anyattn in place of fa3/fa4 where they cannot run.

Declared in pyproject.toml as the entry point ``anyattn`` of the group ``sglang.srt.plugins``, so
``pip install anyattn`` is the whole setup: sglang's ``load_plugins()`` runs :func:`register` in
each of its processes (launcher, schedulers, detokenizer, ...) before the command line is parsed
and before any model is built, then applies the hooks registered here through its
``HookRegistry``. With ``SGLANG_PLUGINS`` set, sglang loads only the plugins it names; include
``anyattn`` there.

:func:`register` does three things:

- ``QKV_BACKEND_IMPL["anyattn"] = VisionAnyAttention``: every vision encoder that looks its
  backend up by name (``VisionAttention`` and the models that index the table themselves) can
  use it.
- an AFTER hook on ``ServerArgs.add_cli_args`` adds ``anyattn`` to the choices of
  ``--mm-attention-backend`` (sglang declares those choices as a fixed list, with no adder).
- where sglang's own platform check would refuse ``fa4`` (no CUDA) or ``fa3`` (neither CUDA nor
  MUSA), AROUND hooks on those backends' ``__init__`` and ``forward`` make each instance
  delegate to a ``VisionAnyAttention``, with one warning per backend and process, instead of
  raising "VisionFlash4Attention is only available for cuda". That covers a flag or config
  carried over from a CUDA deployment as well as a model's own default. Where they can run,
  they are left untouched. The delegate honours ``window_size`` and ``s_aux``, which sglang's
  fa3 backend passes on and its fa4 backend drops.

Imports sglang only inside :func:`register`; ``anyattn.integrations.sglang`` stays free of it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Set, Tuple

import torch

from .sglang import VisionAnyAttention

logger = logging.getLogger(__name__)

BACKEND_NAME = "anyattn"
_VISION_MODULE = "sglang.srt.layers.attention.vision"
_SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
_MM_ATTENTION_BACKEND_DEST = "mm_attention_backend"


def _has_cuda() -> bool:
    from sglang.srt.utils import is_cuda

    return bool(is_cuda())


def _has_cuda_or_musa() -> bool:
    from sglang.srt.utils import is_cuda, is_musa

    return bool(is_cuda() or is_musa())


# The backends anyattn stands in for: name -> (sglang's class, what it needs, whether this process
# has it). The checks are the ones sglang's constructors apply, through sglang's own functions.
_REPLACEABLE_BACKENDS: Dict[str, Tuple[str, str, Callable[[], bool]]] = {
    "fa3": ("VisionFlash3Attention", "CUDA or MUSA", _has_cuda_or_musa),
    "fa4": ("VisionFlash4Attention", "CUDA", _has_cuda),
}

# Backends already announced in this process: the fallback warns once each, not once per layer.
_announced_fallbacks: Set[str] = set()
_hooks_registered = False


def _announce_fallback(name: str, requirement: str) -> None:
    if name in _announced_fallbacks:
        return
    _announced_fallbacks.add(name)
    logger.warning(
        "sglang multimodal attention backend %r needs %s, which this process does not have; "
        "using %r (exact attention, runs on CPU) instead", name, requirement, BACKEND_NAME)


def _fallback_init_hook(name: str, requirement: str) -> Callable[..., None]:
    """AROUND hook for a backend's ``__init__(self, **kwargs)``: build a VisionAnyAttention
    delegate from the same kwargs instead of calling the constructor that would raise."""

    def init(original_init: Callable[..., None], self: torch.nn.Module, *args: Any,
             **kwargs: Any) -> None:
        torch.nn.Module.__init__(self)
        self.anyattn_delegate = VisionAnyAttention(**kwargs)
        _announce_fallback(name, requirement)

    return init


def _fallback_forward(original_forward: Callable[..., torch.Tensor], self: torch.nn.Module,
                      *args: Any, **kwargs: Any) -> torch.Tensor:
    """AROUND hook for a backend's ``forward``: the delegate's result (same contract)."""
    return self.anyattn_delegate(*args, **kwargs)


def _accept_anyattn_choice(result: Any, parser: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook for ``ServerArgs.add_cli_args(parser)``: add anyattn to the choices of
    ``--mm-attention-backend``. The action gets a new list; sglang's declared one is left as is."""
    for action in parser._actions:  # argparse has no public lookup of an action by dest
        if action.dest == _MM_ATTENTION_BACKEND_DEST and action.choices is not None:
            if BACKEND_NAME not in action.choices:
                action.choices = [*action.choices, BACKEND_NAME]
    return None


def register() -> None:
    """sglang plugin entry point (group ``sglang.srt.plugins``): sglang calls it with no arguments
    in each process, then applies the hooks registered here. Idempotent within a process."""
    global _hooks_registered
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    vision = importlib.import_module(_VISION_MODULE)
    vision.QKV_BACKEND_IMPL.setdefault(BACKEND_NAME, VisionAnyAttention)
    if _hooks_registered:
        return
    _hooks_registered = True
    HookRegistry.register(_SERVER_ARGS_ADD_CLI_ARGS, _accept_anyattn_choice, HookType.AFTER)
    for name, (class_name, requirement, runs_here) in _REPLACEABLE_BACKENDS.items():
        if runs_here():
            continue
        target = f"{_VISION_MODULE}.{class_name}"
        HookRegistry.register(f"{target}.__init__", _fallback_init_hook(name, requirement),
                              HookType.AROUND)
        HookRegistry.register(f"{target}.forward", _fallback_forward, HookType.AROUND)
