"""Per-call cost of the flash-attn cache calls with packed queries, and what their plain C call
(python/src/torch_plain_call.cc, `_core.fwd_kvcache_varlen_torch_plain`) saves over planning the
sequences in Python (_fa_plan.py).

One paged decode step of 4 sequences (8 query heads, 2 kv heads, D 64, f32, pages of 16 keys,
5 to 60 keys each), called six ways: flash-attn 2.x's batched cache call and FA3's (the
baseline: the kernel's share), then the packed-query calls: flash-attn 2.x's paged varlen call
(vLLM's style), FA3's cache call with cu_seqlens_q (sglang's style), without and with sinks
(gpt-oss's, a bfloat16 Parameter), and FA4's paged varlen call.
Each packed-query call is timed on its plain C call and on the planned route (the C call
declining), in alternation. Prints the medians of 500 calls (after 50 warm-up calls) in
microseconds and planned / plain:

    .venv/bin/python bench/fa_planning_overhead.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/fa_planning_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

import anyattn
from anyattn import _core, fa3_interface, fa4_interface

_PLAIN_CACHE_CALL = _core.fwd_kvcache_varlen_torch_plain


def _declined(*args):
    return None


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


def plain_and_planned_us(fn, rounds: int = 5):
    """(plain, planned) medians of fn over ``rounds`` alternating rounds of 100 calls each."""
    plain, planned = [], []
    for _ in range(rounds):
        for route, times in ((_PLAIN_CACHE_CALL, plain), (_declined, planned)):
            _core.fwd_kvcache_varlen_torch_plain = route
            try:
                times.append(median_us(fn, 100))
            finally:
                _core.fwd_kvcache_varlen_torch_plain = _PLAIN_CACHE_CALL
    return statistics.median(plain), statistics.median(planned)


def main() -> None:
    batch, heads, heads_k, head_dim, page = 4, 8, 2, 64, 16
    k_cache = torch.randn(64, page, heads_k, head_dim)
    v_cache = torch.randn(64, page, heads_k, head_dim)
    table = torch.arange(64, dtype=torch.int32).reshape(batch, 16)
    lengths = torch.tensor([20, 33, 5, 60], dtype=torch.int32)
    q = torch.randn(batch, 1, heads, head_dim)
    packed_q = q.reshape(batch, heads, head_dim)
    cu_q = torch.arange(batch + 1, dtype=torch.int32)
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 2.0, heads).to(torch.bfloat16),
                               requires_grad=False)  # as gpt-oss keeps them
    batched = {
        "flash_attn_with_kvcache (batched)": lambda: anyattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, block_table=table),
        "fa3 flash_attn_with_kvcache (batched)": lambda: fa3_interface.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, page_table=table),
    }
    packed = {
        "flash_attn_varlen_func (block_table)": lambda: anyattn.flash_attn_varlen_func(
            packed_q, k_cache, v_cache, cu_q, None, 1, 60, seqused_k=lengths,
            block_table=table),
        "fa3 flash_attn_with_kvcache (cu_seqlens_q)": lambda: fa3_interface.flash_attn_with_kvcache(
            packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu_q,
            max_seqlen_q=1),
        "fa3 ... (cu_seqlens_q, sinks)": lambda: fa3_interface.flash_attn_with_kvcache(
            packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu_q,
            max_seqlen_q=1, sinks=sinks),
        "fa4 flash_attn_varlen_func (page_table)": lambda: fa4_interface.flash_attn_varlen_func(
            packed_q, k_cache, v_cache, cu_seqlens_q=cu_q, page_table=table, seqused_k=lengths),
    }
    with torch.no_grad():
        print(f"{'call':44} {'plain us':>9} {'planned us':>11} {'planned/plain':>14}")
        for name, fn in batched.items():
            print(f"{name:44} {median_us(fn):9.1f}")
        for name, fn in packed.items():
            plain, planned = plain_and_planned_us(fn)
            print(f"{name:44} {plain:9.1f} {planned:11.1f} {planned / plain:14.2f}")


if __name__ == "__main__":
    main()
