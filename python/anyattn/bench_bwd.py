"""Forward + backward benchmark: anyattn against torch SDPA on CPU, in one run.

    python -m anyattn.bench_bwd [--quick] [--json PATH]

Shapes: B = 1, H = 16, S in {512, 1024, 2048}, D in {64, 128}, causal and not, float32 and
bfloat16, layout (B, S, H, D) for anyattn and (B, H, S, D) for SDPA (each in its native layout).
Each row times one training step of attention: the forward, then the backward of <out, dout>.
FLOPs: forward = 4 B H D (visible query-key pairs), backward = 2.5 x forward;
GFLOP/s counts useful work (only visible pairs for causal), for both implementations. Reports the
median of several runs after a warm-up, the ratio anyattn / SDPA (> 1: anyattn is faster), and
writes JSON. Both use torch's and anyattn's current thread counts (printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable, Dict, List

import torch

import anyattn


def _median_seconds(fn: Callable[[], object], min_time: float = 0.5, max_runs: int = 10) -> float:
    """Median wall time of fn() over runs taken after one warm-up call."""
    fn()
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _step_flops(s: int, d: int, heads: int, causal: bool) -> float:
    pairs = s * (s + 1) // 2 if causal else s * s
    return 4.0 * heads * d * pairs * 3.5  # forward + 2.5 x forward


def _anyattn_step(q, k, v, dout, causal):
    def run():
        out = anyattn.flash_attn_func(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)
    return run


def _sdpa_step(q, k, v, dout, causal):
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))
    dt = dout.transpose(1, 2).contiguous()

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        torch.autograd.grad(out, (qt, kt, vt), dt)
    return run


def run_table(quick: bool) -> List[Dict[str, object]]:
    """Times every shape; returns one dict per row (also printed as it goes)."""
    seqlens = [512] if quick else [512, 1024, 2048]
    rows: List[Dict[str, object]] = []
    print(f"threads: anyattn {anyattn.get_num_threads()}, torch {torch.get_num_threads()}")
    print(f"{'dtype':8} {'S':>5} {'D':>4} {'mask':7} {'anyattn ms':>11} {'GFLOP/s':>8} "
          f"{'sdpa ms':>9} {'GFLOP/s':>8} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        for s in seqlens:
            for d in (64, 128):
                for causal in (False, True):
                    g = torch.Generator().manual_seed(0)
                    q, k, v, dout = (torch.randn(1, s, 16, d, generator=g).to(dtype)
                                     for _ in range(4))
                    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
                    flops = _step_flops(s, d, 16, causal)
                    t_any = _median_seconds(_anyattn_step(q, k, v, dout, causal))
                    t_sdpa = _median_seconds(_sdpa_step(q, k, v, dout, causal))
                    row = {"dtype": str(dtype).replace("torch.", ""), "B": 1, "H": 16, "S": s,
                           "D": d, "causal": causal, "anyattn_s": t_any, "sdpa_s": t_sdpa,
                           "anyattn_gflops": flops / t_any / 1e9,
                           "sdpa_gflops": flops / t_sdpa / 1e9, "ratio": t_sdpa / t_any}
                    rows.append(row)
                    print(f"{row['dtype']:8} {s:>5} {d:>4} {'causal' if causal else 'full':7} "
                          f"{t_any * 1e3:>11.2f} {row['anyattn_gflops']:>8.1f} "
                          f"{t_sdpa * 1e3:>9.2f} {row['sdpa_gflops']:>8.1f} "
                          f"{row['ratio']:>6.2f}", flush=True)
    return rows


def main(argv=None) -> None:
    """Command-line entry point: prints the table and writes the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S = 512 only")
    parser.add_argument("--json", default="anyattn_bench_bwd.json", help="output JSON path")
    args = parser.parse_args(argv)
    rows = run_table(args.quick)
    meta = {"anyattn_version": anyattn.__version__, "torch_version": torch.__version__,
            "anyattn_threads": anyattn.get_num_threads(), "torch_threads": torch.get_num_threads(),
            "isa": anyattn.isa()}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
