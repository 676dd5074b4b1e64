"""The numpy path with torch absent: a subprocess in which ``import torch`` fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # makes `import torch` raise ImportError
    import numpy as np
    import anyattn
    assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 6, 2, 16)).astype(np.float16)
    out, lse, s_dmask = anyattn.flash_attn_func(q, q, q, causal=True, return_attn_probs=True)
    assert out.dtype == np.float16 and out.shape == (1, 6, 2, 16) and lse.dtype == np.float32
    assert np.isfinite(out).all() and s_dmask.shape == (0,)
    info = anyattn.backends()
    assert info["numpy"]["backend"] == "anyattn", info
    assert info["cpu"]["backend"] == "unavailable" and "torch is not installed" in info["cpu"]["reason"]
    print("ok", anyattn.__version__)
    """
)


def test_numpy_path_works_without_torch():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
