"""The cases of test_ring_flash_attn.py and the per-rank body that runs them.

Shared by both sides of a run: the parent (pytest) builds the full-sequence references from
``full_inputs`` and slices them with ``local_positions``; each worker process (bench/ring_launch.py)
runs ``run_rank``, which calls ring-flash-attn on its shard of the same inputs. This module must
not import transformers, ring_flash_attn or flash_attn at load time: the worker imports it before
its sys.path holds the pinned ring-flash-attn dependencies and before anyattn stands in for
flash_attn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class RingCase:
    """One ring-flash-attn call. ``function`` is "ring" (ring_flash_attn_func), "zigzag"
    (zigzag_ring_flash_attn_func) or "llama3" (llama3_flash_attn_varlen_func). Dense cases use
    (batch, sum(seqlens), heads, head_dim) tensors and ``seqlens`` holds one length; llama3 packs
    the sequences of ``seqlens`` into (total, heads, head_dim)."""

    name: str
    function: str
    dtype: str
    causal: bool
    seqlens: Tuple[int, ...]
    heads_q: int
    heads_k: int
    head_dim: int
    batch: int = 1
    heads_k_stride: int = 1
    seed: int = 0

    @property
    def total(self) -> int:
        return sum(self.seqlens)

    @property
    def varlen(self) -> bool:
        return self.function == "llama3"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# Totals are multiples of 12, so that 2 and 3 ranks each get whole zigzag halves (2 * world_size
# chunks) and whole llama3 slices. The llama3 sequences straddle the rank boundaries.
CASES = (
    RingCase("ring_bf16_causal_gqa", "ring", "bfloat16", True, (192,), 4, 2, 64, batch=2, seed=1),
    RingCase("ring_bf16_full", "ring", "bfloat16", False, (192,), 2, 2, 32, seed=2),
    RingCase("zigzag_bf16_causal", "zigzag", "bfloat16", True, (192,), 4, 4, 64, batch=2, seed=3),
    RingCase("zigzag_f16_causal_mqa", "zigzag", "float16", True, (192,), 4, 1, 32, seed=4),
    RingCase("llama3_bf16_causal_gqa", "llama3", "bfloat16", True, (50, 70, 72), 4, 2, 64,
             heads_k_stride=1, seed=5),
    RingCase("llama3_bf16_full", "llama3", "bfloat16", False, (30, 100, 62), 2, 2, 32,
             heads_k_stride=2, seed=6),
    RingCase("llama3_f16_causal_gqa", "llama3", "float16", True, (84, 12, 96), 4, 2, 32,
             heads_k_stride=2, seed=7),
    # float32 only here: ring and zigzag 0.1.8 start their float32 gradient accumulators with
    # .to(torch.float32), which aliases float32 block buffers (docs/distributed.md).
    RingCase("llama3_f32_full_gqa", "llama3", "float32", False, (60, 36, 96), 4, 2, 32,
             heads_k_stride=1, seed=8),
)


def full_inputs(case: RingCase) -> Dict[str, torch.Tensor]:
    """q, k, v and dout over the whole sequence, float64 tensors holding ``case.dtype`` values."""
    generator = torch.Generator().manual_seed(case.seed)
    lead = (case.total,) if case.varlen else (case.batch, case.total)

    def draw(heads: int) -> torch.Tensor:
        x = torch.randn(lead + (heads, case.head_dim), generator=generator, dtype=torch.float64)
        return x.to(case.torch_dtype).to(torch.float64)

    return {"q": draw(case.heads_q), "k": draw(case.heads_k), "v": draw(case.heads_k),
            "dout": draw(case.heads_q)}


def local_positions(case: RingCase, rank: int, world_size: int) -> torch.Tensor:
    """Sequence positions (token indices for llama3) that ``rank`` holds, in its local order.

    ring and llama3: the rank-th of world_size equal contiguous slices. zigzag: the sequence cut
    into 2 * world_size chunks, rank r holding chunk r then chunk 2 * world_size - 1 - r.
    """
    if case.function == "zigzag":
        chunk = case.total // (2 * world_size)
        first = torch.arange(rank * chunk, (rank + 1) * chunk)
        mirror = 2 * world_size - 1 - rank
        return torch.cat([first, torch.arange(mirror * chunk, (mirror + 1) * chunk)])
    share = case.total // world_size
    return torch.arange(rank * share, (rank + 1) * share)


def cu_seqlens(case: RingCase) -> torch.Tensor:
    """int32 cumulative sequence lengths of the packed llama3 sequences, from 0."""
    return torch.tensor(np.concatenate([[0], np.cumsum(case.seqlens)]), dtype=torch.int32)


def _local_leaf(x: torch.Tensor, positions: torch.Tensor, case: RingCase) -> torch.Tensor:
    """``x`` at ``positions`` of its sequence dimension, in the case's dtype, requiring grad."""
    local = x[positions] if case.varlen else x[:, positions]
    return local.to(case.torch_dtype).contiguous().requires_grad_(True)


def _ring_call(case: RingCase, q, k, v, rank: int, world_size: int):
    """(out, lse) of the case's ring-flash-attn function on this rank's shard."""
    import ring_flash_attn

    if case.function == "ring":
        out, lse, _ = ring_flash_attn.ring_flash_attn_func(
            q, k, v, causal=case.causal, return_attn_probs=True)
        return out, lse
    if case.function == "zigzag":
        out, lse, _ = ring_flash_attn.zigzag_ring_flash_attn_func(
            q, k, v, causal=case.causal, return_attn_probs=True)
        return out, lse
    cu_q, cu_k, max_q, max_k, local_k_slice = ring_flash_attn.llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens(case), causal=case.causal, rank=rank, world_size=world_size)
    out, lse, _ = ring_flash_attn.llama3_flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, heads_k_stride=case.heads_k_stride,
        local_k_slice=local_k_slice, causal=case.causal, return_attn_probs=True)
    return out, lse


def run_rank(rank: int, world_size: int, cases=CASES) -> Dict[str, Dict[str, np.ndarray]]:
    """Worker body: every case forward and backward on this rank's shard.

    anyattn is installed as flash_attn before ring_flash_attn is first imported. Returns, per
    case name, float32 numpy copies of the local out, lse, dq, dk and dv (exact for every case
    dtype).
    """
    import anyattn

    anyattn.install_as_flash_attn()
    results = {}
    for case in cases:
        inputs = full_inputs(case)
        positions = local_positions(case, rank, world_size)
        q, k, v = (_local_leaf(inputs[name], positions, case) for name in ("q", "k", "v"))
        dout = _local_leaf(inputs["dout"], positions, case).detach()
        out, lse = _ring_call(case, q, k, v, rank, world_size)
        out.backward(dout)
        results[case.name] = {
            name: tensor.detach().to(torch.float32).numpy()
            for name, tensor in (("out", out), ("lse", lse), ("dq", q.grad), ("dk", k.grad),
                                 ("dv", v.grad))
        }
    return results


def fail_on_rank_one(rank: int, world_size: int) -> None:
    """Worker body for the launcher's failure test: rank 1 raises, the others wait in a barrier
    that can only end by the launcher ending them (or gloo's timeout)."""
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()
