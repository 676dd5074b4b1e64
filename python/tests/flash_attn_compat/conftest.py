"""The flash-attn compatibility suite: ``flash_attn`` is served by anyattn in this process.

``anyattn.install_as_flash_attn()`` runs here, at import, before pytest imports the test module,
so that ``import flash_attn`` in the tests resolves to anyattn's modules exactly as it would in a
user's program. This is the only place in this folder that names ``anyattn``: the tests speak
flash-attn's API alone.

Everything here needs torch (flash-attn's API is a torch API); without torch the folder is left
out of collection, and the reason is printed in the report header.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

if torch is None:
    collect_ignore_glob = ["test_*.py"]

    def pytest_report_header(config):
        return "flash_attn_compat: skipped, torch is not installed"

else:
    import anyattn

    anyattn.install_as_flash_attn()
