#!/usr/bin/env python3
"""How close anyattn's float32 forward and backward run to flash-attn's 2x rule over many random
problems, not just the one seed each test draws.

    .venv/bin/python python/tests/f32_accuracy_survey.py [--seeds 30] [--dropout 0.3]
        [--causal] [--window L,R] [--softcap C] [--no-sinks] [--amplitude A]

For each seed it draws the dropout test's problem (B 2, Sq 23, Sk 29, Hq 4, Hk 2, D 32, Dv 16;
sinks unless --no-sinks; q and k times --amplitude, which multiplies the scores by its square),
runs flash_attn_func and its autograd on CPU, and compares out, dq, dk,
dv (and dsinks) with the float64 reference under the library's own keep mask. It prints, per
output, the median and largest ratio of anyattn's max error to the naive float32 computation's,
how many seeds exceed 2x, and how many fail the tests' rule (2x the naive error plus one ulp of
the largest reference value). Not a test: the figures go to bench/MEASUREMENTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyattn  # noqa: E402
from reference import max_err, out_eps  # noqa: E402
from torch_reference import attention_torch, leaf, naive_gradients  # noqa: E402

NAMES = ["out", "dq", "dk", "dv", "dsinks"]


def problem(seed: int, amplitude: float):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 23, 4, 32), (2, 29, 2, 32), (2, 29, 2, 16), (2, 23, 4, 16))
    factors = (amplitude, amplitude, 1.0, 1.0)
    q, k, v, dout = ((torch.randn(s, generator=g, dtype=torch.float64) * a).float().double()
                     for s, a in zip(shapes, factors))
    return q, k, v, dout, torch.randn(4, generator=g, dtype=torch.float64)


def survey(seeds: int, p: float, opts: dict, with_sinks: bool, amplitude: float):
    ratios = {n: [] for n in NAMES}
    failures = dict.fromkeys(NAMES, 0)
    for seed in range(seeds):
        q, k, v, dout, sinks = problem(seed, amplitude)
        sinks = sinks if with_sinks else None
        ins = [leaf(x, torch.float32) for x in (q, k, v)]
        if sinks is not None:
            ins.append(leaf(sinks, torch.float32))
        torch.manual_seed(1000 + seed)
        out, _, s_dmask = anyattn.flash_attn_func(
            *ins[:3], dropout_p=p, causal=opts["causal"], window_size=opts["window"],
            softcap=opts["softcap"], sinks=ins[3] if sinks is not None else None,
            return_attn_probs=True)
        keep = ~torch.signbit(s_dmask[:, :, :q.shape[1], :k.shape[1]]) if p > 0 else None
        got = torch.autograd.grad(out, ins, dout.float())
        ins64 = [leaf(x, torch.float64) for x in (q, k, v)] + (
            [leaf(sinks, torch.float64)] if sinks is not None else [])
        kw = dict(causal=opts["causal"], window=opts["window"], softcap=opts["softcap"],
                  keep=keep, dropout_p=p)
        out64 = attention_torch(*ins64[:3], sinks=ins64[3] if sinks is not None else None, **kw)
        ref = torch.autograd.grad(out64, ins64, dout)
        naive_out = attention_torch(*(x.float() for x in (q, k, v)),
                                    sinks=None if sinks is None else sinks.float(), **kw)
        naive = naive_gradients(q, k, v, dout, dtype=torch.float32, sinks=sinks, **kw)
        triples = [("out", out, out64, naive_out)] + list(zip(NAMES[1:], got, ref, naive))
        for name, x, r, n in triples:
            x, r, n = (t.detach().double().numpy() for t in (x, r, n))
            err, naive_err = max_err(x, r), max_err(n, r)
            ratios[name].append(err / max(naive_err, 1e-300))
            failures[name] += not err <= 2 * naive_err + out_eps("float32", r)
    return ratios, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window", default="-1,-1")
    parser.add_argument("--softcap", type=float, default=0.0)
    parser.add_argument("--no-sinks", action="store_true")
    parser.add_argument("--amplitude", type=float, default=1.0)
    args = parser.parse_args()
    opts = dict(causal=args.causal, window=tuple(int(x) for x in args.window.split(",")),
                softcap=args.softcap)
    ratios, failures = survey(args.seeds, args.dropout, opts, not args.no_sinks, args.amplitude)
    print(f"anyattn {anyattn.__version__}, isa {anyattn.isa()}, {args.seeds} seeds, "
          f"dropout {args.dropout}, {opts}, sinks {not args.no_sinks}, amplitude {args.amplitude}")
    for name, values in ratios.items():
        if not values:
            continue
        r = np.array(values)
        print(f"  {name:6s} error / naive error: median {np.median(r):.2f}, max {r.max():.2f}; "
              f"> 2x in {(r > 2).sum()}/{len(r)}; fails 2x + 1 ulp in {failures[name]}/{len(r)}")


if __name__ == "__main__":
    main()
