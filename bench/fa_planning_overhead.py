"""Per-call cost of the FA3/FA4 calls that plan their sequences in Python (_fa_plan.py).

One paged decode step of 4 sequences (8 query heads, 2 kv heads, D 64, f32, pages of 16 keys,
5 to 60 keys each), called four ways: flash-attn 2.x's batched cache call, FA3's batched cache
call, FA3's packed-query cache call (sglang's style, with cu_seqlens_q) and FA4's paged varlen
call. The kernel's share is about the batched calls' time; the rest of the last two is planning.
Prints the median of 500 calls (after 50 warm-up calls) of each, in microseconds:

    .venv/bin/python bench/fa_planning_overhead.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/fa_planning_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

import anyattn
from anyattn import fa3_interface, fa4_interface


def median_us(fn, calls: int = 500) -> float:
    """Median microseconds of ``calls`` calls of fn, after 50 warm-up calls."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    batch, heads, heads_k, head_dim, page = 4, 8, 2, 64, 16
    k_cache = torch.randn(64, page, heads_k, head_dim)
    v_cache = torch.randn(64, page, heads_k, head_dim)
    table = torch.arange(64, dtype=torch.int32).reshape(batch, 16)
    lengths = torch.tensor([20, 33, 5, 60], dtype=torch.int32)
    q = torch.randn(batch, 1, heads, head_dim)
    packed_q = q.reshape(batch, heads, head_dim)
    cu_q = torch.arange(batch + 1, dtype=torch.int32)
    calls = {
        "flash_attn_with_kvcache (batched)": lambda: anyattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, block_table=table),
        "fa3 flash_attn_with_kvcache (batched)": lambda: fa3_interface.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, page_table=table),
        "fa3 flash_attn_with_kvcache (cu_seqlens_q)": lambda: fa3_interface.flash_attn_with_kvcache(
            packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu_q,
            max_seqlen_q=1),
        "fa4 flash_attn_varlen_func (page_table)": lambda: fa4_interface.flash_attn_varlen_func(
            packed_q, k_cache, v_cache, cu_seqlens_q=cu_q, page_table=table, seqused_k=lengths),
    }
    with torch.no_grad():
        for name, fn in calls.items():
            print(f"{name:44} {median_us(fn):8.1f} us")


if __name__ == "__main__":
    main()
