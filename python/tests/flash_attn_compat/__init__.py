"""flash-attn compatibility tests (a package, so that its conftest does not shadow python/tests/conftest.py)."""
