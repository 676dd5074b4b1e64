"""``install_as_flash_attn()``: flash-attn's module names served by anyattn in this process.

Code that imports flash-attn itself (model files, ring-flash-attn, FlashAttention 3 and 4 call
sites) runs unmodified after one call. Where a name resolves depends on what is installed:

- The real package absent, or failing to import (a CUDA build on a machine without CUDA): every
  name below resolves to anyattn's module, through a finder placed on ``sys.meta_path``.
- The real package importable: it stays in charge of its own modules and of CUDA tensors; its
  public and private attention functions are wrapped so that calls whose tensors are on the CPU
  reach anyattn. Names it lacks (FA3's ``flash_attn_interface``, FA4's ``flash_attn.cute``) still
  resolve to anyattn, since the finder runs after the regular path search.

    flash_attn                        (package: __version__ and the seven public functions)
    flash_attn.flash_attn_interface   anyattn.flash_attn_interface
    flash_attn.bert_padding           anyattn.bert_padding
    flash_attn.layers                 (package)
    flash_attn.layers.rotary          anyattn.rotary
    flash_attn.cute                   (package: FA4's public functions)
    flash_attn.cute.interface         anyattn.fa4_interface
    flash_attn_interface              anyattn.fa3_interface   (FlashAttention 3's top level)

The aliases are anyattn's own module objects, so ``flash_attn.flash_attn_interface`` *is*
``anyattn.flash_attn_interface``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import pathlib
import re
import sys
import types
from typing import Any, Dict, Optional

from . import flash_attn_interface as _fa2

# The flash-attn release whose Python API anyattn reproduces; libraries compare against it.
FLASH_ATTN_VERSION = "2.8.3"

# Functions of a real flash_attn.flash_attn_interface that get a CPU route: all of
# anyattn.flash_attn_interface's (flash-attn 2.8's public and private attention functions).
_ROUTED_FUNCTIONS = tuple(_fa2.__all__)

# Public names of flash_attn/__init__.py: the public ones among them.
_PACKAGE_EXPORTS = tuple(name for name in _ROUTED_FUNCTIONS if not name.startswith("_"))

# Alias name -> anyattn module; None marks a package that anyattn builds here (see _package).
_ALIASES: Dict[str, Optional[str]] = {
    "flash_attn": None,
    "flash_attn.flash_attn_interface": "anyattn.flash_attn_interface",
    "flash_attn.bert_padding": "anyattn.bert_padding",
    "flash_attn.layers": None,
    "flash_attn.layers.rotary": "anyattn.rotary",
    "flash_attn.cute": None,
    "flash_attn.cute.interface": "anyattn.fa4_interface",
    "flash_attn_interface": "anyattn.fa3_interface",
}

# Marks modules and functions that are anyattn's stand-ins, so that anyattn's own CUDA route never
# mistakes them for the real package (and never routes a call back to itself).
SHIM_MARKER = "__anyattn_shim__"


def _package(name: str) -> types.ModuleType:
    """The stand-in for a flash-attn package module: ``flash_attn`` (version and public
    functions), ``flash_attn.cute`` (FA4's public functions) or ``flash_attn.layers`` (empty)."""
    module = types.ModuleType(name)
    module.__path__ = []  # a package: its submodules come from the finder below
    setattr(module, SHIM_MARKER, True)
    exports = ()
    if name == "flash_attn":
        module.__version__ = FLASH_ATTN_VERSION
        source, exports = importlib.import_module("anyattn.flash_attn_interface"), _PACKAGE_EXPORTS
    elif name == "flash_attn.cute":
        source = importlib.import_module("anyattn.fa4_interface")
        exports = tuple(source.__all__)
        module.__version__ = getattr(source, "__version__", FLASH_ATTN_VERSION)
    for export in exports:
        setattr(module, export, getattr(source, export))
    module.__all__ = list(exports)
    return module


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as anyattn's module object (or a package built by _package)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def create_module(self, spec):
        target = _ALIASES[self._name]
        if target is None:
            return _package(self._name)
        module = importlib.import_module(target)
        setattr(module, SHIM_MARKER, True)
        return module

    def exec_module(self, module) -> None:
        """Nothing to run: the module is complete when created."""


class _StandInDistribution(importlib.metadata.Distribution):
    """Package metadata of the stand-in, so that ``importlib.metadata.version("flash_attn")``
    answers as it does with flash-attn installed (libraries check versions both ways)."""

    def read_text(self, filename):
        if filename != "METADATA":
            return None
        return (f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {FLASH_ATTN_VERSION}\n"
                "Summary: anyattn's stand-in for flash-attn (anyattn.install_as_flash_attn)\n")

    def locate_file(self, path):
        return pathlib.Path(__file__).parent / path


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the alias names; placed after the regular finders unless the real package is broken.
    While it serves ``flash_attn`` itself, it also answers for that package's metadata."""

    serves_package = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname),
                                              is_package=_ALIASES[fullname] is None)

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        wanted = name is None or re.sub(r"[-_.]+", "_", name).lower() == "flash_attn"
        return iter([_StandInDistribution()] if self.serves_package and wanted else [])


_FINDER = _AliasFinder()


def _forget_flash_attn_modules() -> None:
    """Drop every flash_attn module object a failed import left in sys.modules."""
    for name in list(sys.modules):
        if name == "flash_attn" or name.startswith("flash_attn."):
            del sys.modules[name]


def _real_flash_attn_importable() -> bool:
    """True if a flash_attn that is not anyattn's imports without error in this process."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    existing = sys.modules.get("flash_attn")
    if existing is not None:
        return not getattr(existing, SHIM_MARKER, False)
    if importlib.machinery.PathFinder.find_spec("flash_attn") is None:
        return False
    try:
        importlib.import_module("flash_attn.flash_attn_interface")
    except Exception:  # noqa: BLE001 - any failure (missing CUDA libraries, ABI mismatch) counts
        _forget_flash_attn_modules()
        return False
    return True


def _on_cpu(args, kwargs) -> bool:
    """True if the call's first tensor argument lives on the CPU."""
    for value in list(args) + list(kwargs.values()):
        device = getattr(value, "device", None)
        if device is not None and hasattr(value, "dtype"):
            return device.type == "cpu"
    return False


def _cpu_routed(original: Any, ours: Any) -> Any:
    """``original`` with calls on CPU tensors sent to ``ours``; keeps original's signature, which
    libraries read with inspect (ring-flash-attn fills arguments from it)."""
    signature_source = getattr(original, "_init_fn", original)  # torch.library.custom_op objects

    @functools.wraps(signature_source)
    def routed(*args, **kwargs):
        if _on_cpu(args, kwargs):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    routed.__signature__ = inspect.signature(signature_source)
    routed.__anyattn_original__ = original
    setattr(routed, SHIM_MARKER, True)
    return routed


def _route_real_package_cpu_calls() -> None:
    """Wrap the real flash_attn's attention functions so CPU tensors run anyattn."""
    package = sys.modules["flash_attn"]
    interface = sys.modules["flash_attn.flash_attn_interface"]
    for module in (interface, package):
        for name in _ROUTED_FUNCTIONS:
            original = getattr(module, name, None)
            if original is None or getattr(original, SHIM_MARKER, False):
                continue
            setattr(module, name, _cpu_routed(original, getattr(_fa2, name)))


def original_function(function: Any) -> Any:
    """The real flash_attn function behind a CPU-routing wrapper (itself if not wrapped)."""
    return getattr(function, "__anyattn_original__", function)


def install_as_flash_attn() -> str:
    """Make flash-attn's import names resolve to anyattn in this process (idempotent).

    Call it once per process before the code that imports flash_attn (for multi-process jobs, in
    every worker). Covers modules imported afterwards by any package. Returns "anyattn" when
    anyattn serves ``flash_attn`` itself, or "flash_attn" when the real package is importable and
    keeps its modules, with its attention functions routing CPU tensors to anyattn.
    """
    if _real_flash_attn_importable():
        _route_real_package_cpu_calls()
        _FINDER.serves_package = False
        sys.meta_path.append(_FINDER)  # after PathFinder: only names the real package lacks
        return "flash_attn"
    _FINDER.serves_package = True
    sys.meta_path.insert(0, _FINDER)  # before PathFinder: a broken real package is bypassed
    return "anyattn"
