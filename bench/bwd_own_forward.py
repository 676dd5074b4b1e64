#!/usr/bin/env python3
"""What the backward's own_forward costs: torch.ops.anyattn.bwd on the same inputs with
own_forward False and True, timed in alternation in one process.

    .venv/bin/python bench/bwd_own_forward.py [--runs 30] [--dtype float32|bfloat16|float16]
        [--sinks]

own_forward (anyattn_fwd_params::bwd_own_forward, docs/backward.md) normalises each row whose
visible keys lie in one 64-key block from its own scores, which forms that row's probabilities
twice, and in bf16 and f16 calls with sinks sums dsinks from every tile's P Z dP. The shapes are
the ones where such rows are many: short sequences, and sliding windows, with a long causal row
for contrast (only its first 64 rows qualify). Prints the median time of each and the ratio
own_forward / plain (above 1: own_forward is slower). Uses anyattn's thread count
(ANYATTN_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import anyattn  # noqa: F401  (registers torch.ops.anyattn)

# (B, S, H, D, causal, (window_left, window_right))
SHAPES = [
    (256, 16, 16, 64, False, (-1, -1)),
    (64, 64, 16, 64, False, (-1, -1)),
    (64, 64, 16, 128, True, (-1, -1)),
    (1, 2048, 16, 64, False, (32, 0)),
    (1, 2048, 16, 128, False, (16, 16)),
    (1, 2048, 16, 128, True, (-1, -1)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--sinks", action="store_true", help="a sink per head (dsinks computed)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    print(f"anyattn {anyattn.__version__}, isa {anyattn.isa()}, threads "
          f"{anyattn.get_num_threads()}, {args.dtype}, sinks {args.sinks}, {args.runs} "
          "alternating runs")
    for b, s, h, d, causal, (left, right) in SHAPES:
        q, k, v, dout = (torch.randn(b, s, h, d, dtype=dtype) for _ in range(4))
        sinks = torch.randn(h) if args.sinks else None
        right = 0 if causal else right
        out, lse = torch.ops.anyattn.fwd(q, k, v, 0.0, 0.0, causal, left, right, None, sinks)
        call = (dout, q, k, v, out, lse, 0.0, 0.0, causal, left, right, None, sinks, 0.0, None)
        times = {False: [], True: []}
        for own in (False, True):  # warm-up
            torch.ops.anyattn.bwd(*call, own_forward=own)
        for _ in range(args.runs):
            for own in (False, True):
                start = time.perf_counter()
                torch.ops.anyattn.bwd(*call, own_forward=own)
                times[own].append(time.perf_counter() - start)
        plain, own = statistics.median(times[False]), statistics.median(times[True])
        print(f"B{b} S{s} H{h} D{d} causal={causal} window=({left},{right}): plain "
              f"{plain * 1e3:.3f} ms, own_forward {own * 1e3:.3f} ms, ratio {own / plain:.3f}")


if __name__ == "__main__":
    main()
