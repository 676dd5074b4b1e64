"""Shape, dtype and device checks on the tensors of an attention call.

They run before any backend so that every front end reports the same error, with a message that
names the argument, the value given and what is accepted. They only read shapes and dtypes (no
data), so torch.compile traces them without a graph break.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

from . import _core

# The C library's limits (ANYATTN_MAX_HEAD_DIM and ANYATTN_MAX_HEAD_DIM_V in anyattn.h): the head
# dim of q and k, and that of v.
MAX_HEAD_DIM = _core.MAX_HEAD_DIM
MAX_HEAD_DIM_V = _core.MAX_HEAD_DIM_V


def check_rank(x: Any, name: str, ndim: int, layout: str) -> None:
    """Raise ValueError unless ``x`` has ``ndim`` dimensions (``layout`` names them, e.g. "(B, S, H, D)")."""
    if x.ndim != ndim:
        raise ValueError(
            f"{name}: expected {ndim} dimensions {layout}, got shape {tuple(x.shape)}"
        )


def check_last_dim(x: Any, name: str, limit: int) -> None:
    """Raise ValueError unless the head dimension of ``x`` is in [0, limit] (0: see docs/semantics.md, section 6)."""
    d = x.shape[-1]
    if not 0 <= d <= limit:
        raise ValueError(f"{name}: head dimension must be in [0, {limit}], got {d} (shape {tuple(x.shape)})")


def check_dense_shapes(q: Any, k: Any, v: Any) -> Tuple[int, int, int, int, int, int, int]:
    """Check q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv) and return (B, Sq, Sk, Hq, Hk, D, Dv)."""
    check_rank(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    check_rank(k, "k", 4, "(batch, seqlen_k, nheads_k, headdim)")
    check_rank(v, "v", 4, "(batch, seqlen_k, nheads_k, headdim_v)")
    b, sq, hq, d = q.shape
    bk, sk, hk, dk = k.shape
    bv, skv, hkv, dv = v.shape
    if bk != b or bv != b:
        raise ValueError(
            f"k, v: batch size must match q's {b}, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if dk != d:
        raise ValueError(f"k: head dimension must match q's {d}, got shape {tuple(k.shape)}")
    if skv != sk or hkv != hk:
        raise ValueError(
            f"v: seqlen_k and nheads_k must match k's ({sk}, {hk}), got shape {tuple(v.shape)}"
        )
    if hk == 0 and hq > 0:
        raise ValueError(
            f"k: nheads_k is 0 but q has nheads={hq}; there are no key/value heads to attend with "
            "(nheads_k must be >= 1 unless nheads is 0)"
        )
    if hk > 0 and hq % hk != 0:
        raise ValueError(
            f"k: nheads_k must divide q's nheads (GQA/MQA), got nheads={hq} and nheads_k={hk}"
        )
    check_last_dim(q, "q", MAX_HEAD_DIM)
    check_last_dim(v, "v", MAX_HEAD_DIM_V)
    return b, sq, sk, hq, hk, d, dv


def check_same_dtype(tensors: Sequence[Tuple[str, Any]]) -> None:
    """Raise TypeError unless all named tensors share the first one's dtype."""
    name0, t0 = tensors[0]
    for name, t in tensors[1:]:
        if t.dtype != t0.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from {name0}'s {t0.dtype}; q, k and v must share one dtype")


def check_per_head(x: Any, name: str, batch: int, nheads: int, allow_batched: bool) -> None:
    """Raise ValueError unless ``x`` has shape (nheads,) or, if allowed, (batch, nheads)."""
    shape = tuple(x.shape)
    ok = shape == (nheads,) or (allow_batched and shape == (batch, nheads))
    if not ok:
        want = f"({nheads},)" + (f" or ({batch}, {nheads})" if allow_batched else "")
        raise ValueError(f"{name}: expected shape {want}, got {shape}")
