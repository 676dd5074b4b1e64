"""sglang integration: a vision-attention backend with the contract of sglang's ``QKV_BACKEND_IMPL``.

sglang's vision encoders call ``backend.forward(q, k, v, cu_seqlens, bsz, seq_len, softmax_scale=...,
forward_metadata=..., **kwargs)`` with packed q/k/v of shape (total_tokens, heads, head_dim) and
expect (total_tokens, heads, head_dim_v) back. ``VisionAnyAttention`` honours ``softmax_scale``,
``window_size`` and ``s_aux`` (sinks) from those kwargs, which most of sglang's backends drop, and
runs on any device through ``anyattn.flash_attn_varlen_func`` (one call for the whole packed
batch on CPU; flash_attn or SDPA elsewhere).

sglang finds it through anyattn's plugin (``sglang_plugin.py``, entry point group
``sglang.srt.plugins``), which registers it as ``QKV_BACKEND_IMPL["anyattn"]``, makes
``--mm-attention-backend anyattn`` valid and puts it in place of fa3/fa4 where those cannot run.
This module does not import sglang.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from ..varlen import flash_attn_varlen_func


def _resolve_cu_seqlens(cu_seqlens: Any, bsz: int, seq_len: int, forward_metadata: Any) -> List[int]:
    """Sequence boundaries as Python ints, from any of the forms sglang passes.

    Accepted: ``forward_metadata.cu_seqlens``; a tensor; a list whose first item is the tensor
    (sglang's cuda-graph mode); an object with ``empty()``/``get_data()``/``set_data()`` (sglang's
    SingletonCache, filled with uniform boundaries when empty); or None (``bsz`` sequences of
    ``seq_len`` tokens).
    """
    if forward_metadata is not None and getattr(forward_metadata, "cu_seqlens", None) is not None:
        cu_seqlens = forward_metadata.cu_seqlens
    if isinstance(cu_seqlens, (list, tuple)) and cu_seqlens and isinstance(cu_seqlens[0], torch.Tensor):
        cu_seqlens = cu_seqlens[0]
    if cu_seqlens is not None and hasattr(cu_seqlens, "get_data"):
        if cu_seqlens.empty():
            cu_seqlens.set_data(torch.arange(0, (bsz + 1) * seq_len, seq_len, dtype=torch.int32))
        cu_seqlens = cu_seqlens.get_data()
    if cu_seqlens is None:
        return list(range(0, (bsz + 1) * seq_len, seq_len))
    if isinstance(cu_seqlens, torch.Tensor):
        return [int(x) for x in cu_seqlens.detach().to("cpu").tolist()]
    return [int(x) for x in cu_seqlens]


class VisionAnyAttention(torch.nn.Module):
    """Vision attention backend for sglang (non-causal, per-image sequences packed along dim 0)."""

    def __init__(self, **kwargs: Any) -> None:
        """Accepts and ignores sglang's constructor kwargs (head counts, use_data_parallel, ...)."""
        super().__init__()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: Any,
        bsz: int,
        seq_len: int,
        softmax_scale: Optional[float] = None,
        forward_metadata: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Attention within each sequence of a packed batch.

        q (T, Hq, D), k (T, Hk, D), v (T, Hk, Dv), or the same with a leading (bsz, seq_len) pair
        instead of T. kwargs used: ``window_size`` ((left, right), default (-1, -1)), ``s_aux``
        (per-head sinks, (Hq,)) and ``causal`` (default False). Returns (T, Hq, Dv), or
        (bsz, seq_len, Hq, Dv) for 4-D inputs.
        """
        batched = q.dim() == 4
        if batched:
            q, k, v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
        bounds = _resolve_cu_seqlens(cu_seqlens, bsz, seq_len, forward_metadata)
        if bounds[-1] != q.shape[0] or bounds[0] != 0:
            raise ValueError(
                f"cu_seqlens: must run from 0 to the {q.shape[0]} packed tokens, got {bounds}"
            )
        options = dict(
            softmax_scale=softmax_scale,
            causal=bool(kwargs.get("causal", False)),
            window_size=tuple(kwargs.get("window_size", (-1, -1)) or (-1, -1)),
            sinks=kwargs.get("s_aux"),
        )
        cu = torch.tensor(bounds, dtype=torch.int32)
        longest = max((b - a for a, b in zip(bounds[:-1], bounds[1:])), default=0)
        out = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, **options)
        if batched:
            out = out.reshape(bsz, -1, *out.shape[1:])
        return out
