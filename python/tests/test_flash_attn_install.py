"""install_as_flash_attn(): which package serves flash-attn's names, in fresh interpreters.

Three installations are covered, each in its own subprocess (the layer changes sys.meta_path and
sys.modules for the whole process): no flash_attn at all; a flash_attn that fails to import (a
CUDA build on a machine without CUDA); and an importable flash_attn, for which a stand-in package
written here records the calls that reach it. The stand-in tests the routing only: CPU tensors
must reach anyattn, other devices the package itself, and the signatures libraries inspect must be
the package's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

_IMPORTABLE_PACKAGE = {
    "flash_attn/__init__.py": """
        __version__ = "2.7.4.post1"
        from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func
    """,
    "flash_attn/flash_attn_interface.py": """
        CALLS = []

        def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                            deterministic=False, return_attn_probs=False):
            CALLS.append("flash_attn_func")
            return "real"

        def flash_attn_varlen_func(*args, **kwargs):
            CALLS.append("flash_attn_varlen_func")
            return "real"

        def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                                window_size_right, softcap, alibi_slopes, return_softmax):
            CALLS.append("_flash_attn_forward")
            return "real"
    """,
}

_BROKEN_PACKAGE = {
    "flash_attn/__init__.py": """
        raise ImportError("libcudart.so.12: cannot open shared object file")
    """,
}


def _run(script: str, tmp_path, package=None) -> str:
    """Run ``script`` in a fresh interpreter, with ``package`` (path -> source) on sys.path."""
    env = dict(os.environ)
    if package is not None:
        for relative, source in package.items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_without_flash_attn_every_name_is_anyattn(tmp_path):
    out = _run("""
        import importlib, importlib.util, inspect
        import anyattn
        assert importlib.util.find_spec("flash_attn") is None, "flash_attn installed here"
        assert anyattn.install_as_flash_attn() == "anyattn"
        assert anyattn.install_as_flash_attn() == "anyattn"  # idempotent
        import flash_attn
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
        from flash_attn.flash_attn_interface import (_flash_attn_forward, _flash_attn_backward,
            _flash_attn_varlen_forward, _flash_attn_varlen_backward)
        import flash_attn.flash_attn_interface as fai
        assert fai is anyattn.flash_attn_interface and flash_attn_func is fai.flash_attn_func
        from flash_attn.bert_padding import pad_input, unpad_input, index_first_axis
        from flash_attn.layers.rotary import apply_rotary_emb
        assert tuple(int(x) for x in flash_attn.__version__.split(".")[:2]) >= (2, 8)
        import importlib.metadata
        assert importlib.metadata.version("flash_attn") == flash_attn.__version__
        assert importlib.metadata.version("flash-attn") == flash_attn.__version__
        # anyattn's own CUDA route must not take its stand-in for the real package.
        from anyattn import _dispatch
        assert _dispatch.flash_attn_version() is None
        print(inspect.getfullargspec(_flash_attn_forward).args)
    """, tmp_path)
    assert "window_size_left" in out


def test_broken_flash_attn_is_bypassed(tmp_path):
    _run("""
        import anyattn, torch
        assert anyattn.install_as_flash_attn() == "anyattn"
        import flash_attn
        assert getattr(flash_attn, "__anyattn_shim__", False)
        q = torch.randn(1, 5, 2, 8)
        torch.testing.assert_close(flash_attn.flash_attn_func(q, q, q, causal=True),
                                   anyattn.flash_attn_func(q, q, q, causal=True), rtol=0, atol=0)
    """, tmp_path, _BROKEN_PACKAGE)


def test_importable_flash_attn_keeps_other_devices_and_cpu_reaches_anyattn(tmp_path):
    _run("""
        import inspect
        import anyattn, torch
        assert anyattn.install_as_flash_attn() == "flash_attn"
        import flash_attn
        import flash_attn.flash_attn_interface as fai
        assert flash_attn.__version__ == "2.7.4.post1"  # the real package's modules stay
        import importlib.metadata
        try:  # the stand-in package has no metadata of its own; anyattn claims none for it
            importlib.metadata.version("flash_attn")
            raise AssertionError("anyattn answered for a real package's metadata")
        except importlib.metadata.PackageNotFoundError:
            pass
        q = torch.randn(1, 5, 2, 8)
        got = flash_attn.flash_attn_func(q, q, q, causal=True)
        torch.testing.assert_close(got, anyattn.flash_attn_func(q, q, q, causal=True),
                                   rtol=0, atol=0)
        got = fai._flash_attn_forward(q, q, q, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None, False)
        assert len(got) == 4
        assert fai.CALLS == []
        meta = torch.empty(1, 5, 2, 8, device="meta")
        assert flash_attn.flash_attn_func(meta, meta, meta) == "real"
        assert fai.flash_attn_varlen_func(q=meta) == "real"
        assert fai.CALLS == ["flash_attn_func", "flash_attn_varlen_func"]
        # Libraries fill arguments from the signature: it must be the package's own.
        assert inspect.getfullargspec(fai._flash_attn_forward).args[-1] == "return_softmax"
        assert "return_attn_probs" in inspect.signature(flash_attn.flash_attn_func).parameters
        # anyattn's own CUDA route calls the package itself, not the CPU-routing wrapper.
        from anyattn._flash_attn_compat import original_function
        assert original_function(flash_attn.flash_attn_func)(meta, meta, meta) == "real"
    """, tmp_path, _IMPORTABLE_PACKAGE)
