#!/usr/bin/env python3
"""FA3's ``qv`` decode at DeepSeek's shape, against the same call written as anyattn's shared
latent cache, in one process.

Three calls, timed in alternation (medians over rounds of one call each, after a warm-up):
- ``fa3 qv, [v | k] row``: anyattn.fa3_interface.flash_attn_with_kvcache(q, cache[..., Dv:],
  cache[..., :Dv], qv=qv, ...), DeepSeek's latent cache split into its two column ranges, which
  anyattn reads in place;
- ``shared latent call``: anyattn.flash_attn_with_kvcache([qv | q], cache, cache[..., :Dv], ...),
  what the first call amounts to, written by hand (the baseline of the ratios);
- ``fa3 qv, separate caches``: the same keys and values as two tensors of their own, which the
  qv path gathers into a copy on each call.

    .venv/bin/python bench/fa3_qv_decode.py [--keys 8192] [--heads 16] [--rounds 61]

Run it with OMP_WAIT_POLICY=PASSIVE so that torch's OpenMP workers do not spin between calls.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import anyattn
from anyattn import fa3_interface as fa3

D, DV, PAGE = 64, 512, 64  # DeepSeek's rotary and latent widths; pages of 64 positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=8192, help="cached keys (a multiple of 64)")
    parser.add_argument("--heads", type=int, default=16, help="query heads (one latent kv head)")
    parser.add_argument("--rounds", type=int, default=61, help="timed rounds")
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = args.keys // PAGE
    cache = torch.randn(blocks, PAGE, 1, DV + D).bfloat16()
    table = torch.arange(blocks, dtype=torch.int32)[None]
    seqlens = torch.tensor([args.keys], dtype=torch.int32)
    q = torch.randn(1, 1, args.heads, D).bfloat16()
    qv = torch.randn(1, 1, args.heads, DV).bfloat16()
    k_separate, v_separate = cache[..., DV:].clone(), cache[..., :DV].clone()
    widened = torch.cat([qv, q], -1)
    calls = {
        "fa3 qv, [v | k] row": lambda: fa3.flash_attn_with_kvcache(
            q, cache[..., DV:], cache[..., :DV], qv=qv, cache_seqlens=seqlens, page_table=table),
        "shared latent call": lambda: anyattn.flash_attn_with_kvcache(
            widened, cache, cache[..., :DV], cache_seqlens=seqlens, block_table=table,
            softmax_scale=(D + DV) ** -0.5),
        "fa3 qv, separate caches": lambda: fa3.flash_attn_with_kvcache(
            q, k_separate, v_separate, qv=qv, cache_seqlens=seqlens, page_table=table),
    }
    for call in calls.values():
        for _ in range(3):
            call()
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["shared latent call"])
    print(f"B1 Hq{args.heads}/Hk1 D{D}+{DV} Sk{args.keys} bf16, pages of {PAGE}, "
          f"threads={anyattn.get_num_threads()}, medians of {args.rounds} rounds")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:26} {median * 1e3:8.3f} ms   x shared latent call {median / base:.3f}")


if __name__ == "__main__":
    main()
