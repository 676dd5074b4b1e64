"""The flash-attn compatibility suite: ``flash_attn`` is served by anyattn in this process.

``anyattn.install_as_flash_attn()`` runs here, at import, before pytest imports the test modules,
so that ``import flash_attn`` in the tests resolves to anyattn's modules exactly as it would in a
user's program. This is the only place in this folder that names ``anyattn``: the tests speak
flash-attn's API alone.

Everything here needs torch (flash-attn's API is a torch API). Without torch nothing is installed
and the folder is skipped: each test module starts with ``pytest.importorskip("torch")``, which
reports the skip and its reason whether pytest runs this folder alone or the whole suite (a
``pytest.skip`` raised from a conftest would abort a run that starts in this folder).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

if torch is not None:
    import anyattn

    anyattn.install_as_flash_attn()
