#!/usr/bin/env python3
"""GFLOP/s against sequence length, one line per implementation, as a PNG.

Used by torch_sdpa.py, and on its own for the JSON that anyattn_bench writes:

    python3 bench/plot_results.py bench/results/latest.json -o bench/results/latest.png

Needs matplotlib; without it, prints a message and exits 0.
"""

import argparse
import json
import sys


def plot_gflops(panels, path, title):
    """Writes a PNG to `path` with one subplot per panel.

    `panels` maps a panel title to {implementation label: [(seqlen, gflops), ...]}. Returns False
    (after printing why) when matplotlib is not installed, True once the file is written.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed; no plot written (pip install matplotlib)")
        return False
    names = sorted(panels)
    columns = min(4, max(1, len(names)))
    rows = (len(names) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for index, name in enumerate(names):
        axis = axes[index // columns][index % columns]
        for label, points in sorted(panels[name].items()):
            points = sorted(p for p in points if p[1] is not None)
            if not points:
                continue
            style = dict(linestyle="--", color="gray") if label == "fma peak" else dict(marker="o")
            axis.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
        axis.set_xscale("log", base=2)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("sequence length S")
        axis.set_ylabel("GFLOP/s")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    for index in range(len(names), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"plot: {path}")
    return True


def panels_from_bench_json(report):
    """Panels for the forward rows of anyattn_bench's JSON: one panel per (threads, dtype, mask,
    D, Hk), lines for anyattn, the OpenBLAS unfused baseline and, as a flat line, the FMA peak."""
    panels = {}
    for row in report.get("forward", []):
        if row["seqlen_q"] != row["seqlen_k"]:
            continue
        name = (f"{row['threads']} thr {row['dtype']} {row['mask']} D{row['head_dim']} "
                f"H{row['heads_q']}/{row['heads_k']}")
        lines = panels.setdefault(name, {})
        seqlen = row["seqlen_q"]
        lines.setdefault("anyattn", []).append((seqlen, row.get("anyattn_gflops")))
        lines.setdefault("openblas unfused", []).append(
            (seqlen, row.get("openblas_unfused_gflops")))
        lines.setdefault("fma peak", []).append((seqlen, row.get("fma_peak_gflops")))
    return panels


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="JSON written by anyattn_bench")
    parser.add_argument("-o", "--output", help="PNG path (default: the JSON path with .png)")
    args = parser.parse_args()
    with open(args.json) as handle:
        report = json.load(handle)
    output = args.output or (args.json.rsplit(".", 1)[0] + ".png")
    title = f"anyattn forward, {report.get('cpu_model', '')} ({report.get('timestamp', '')})"
    plot_gflops(panels_from_bench_json(report), output, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
