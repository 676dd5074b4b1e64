"""The figure of ``python -m anyattn.bench --png``: rate against sequence length, read at a glance.

Layout: one row of panels per (dtype, mask); in each row one panel per head dim with GFLOP/s of
every implementation, and a last panel with anyattn's speed-up over torch SDPA. Colour says which
implementation (one colour each, the same in every panel); line style says the shape (Hk = 16
solid, Hk = 4 dashed; in the speed-up panel the head dim is the marker). A grey line marks the
f32 FMA ceiling passed in, and a dotted line the speed-up of 1. One legend, on the figure.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

IMPLEMENTATIONS = (("anyattn", "anyattn", "tab:blue"),
                   ("sdpa", "torch SDPA (flash)", "tab:orange"),
                   ("math", "torch SDPA (math)", "tab:green"))
KV_HEAD_STYLES = {16: "-", 4: "--"}
HEAD_DIM_MARKERS = {64: "o", 128: "s"}


def _series(rows: Sequence[Dict[str, object]], **match) -> List[Dict[str, object]]:
    """The rows whose fields equal ``match``, by sequence length."""
    picked = [r for r in rows if all(r[key] == value for key, value in match.items())]
    return sorted(picked, key=lambda r: r["s"])


def build_figure(rows: Sequence[Dict[str, object]], peak_gflops: Optional[float], peak_label: str):
    """The matplotlib Figure for benchmark ``rows`` (dicts as run_table returns them).

    ``peak_gflops`` (None to omit) is drawn as a horizontal line labelled ``peak_label`` in every
    rate panel. Raises ImportError without matplotlib.
    """
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415

    groups = sorted({(r["dtype"], r["causal"]) for r in rows})
    head_dims = sorted({r["d"] for r in rows})
    kv_heads = sorted({r["hk"] for r in rows}, reverse=True)
    lengths = sorted({r["s"] for r in rows})
    columns = len(head_dims) + 1
    fig, axes = plt.subplots(len(groups), columns, figsize=(4.2 * columns, 3.2 * len(groups)),
                             squeeze=False)
    for row_axes, (dtype, causal) in zip(axes, groups):
        mask = "causal" if causal else "no mask"
        for ax, d in zip(row_axes, head_dims):
            for hk in kv_heads:
                sel = _series(rows, dtype=dtype, causal=causal, d=d, hk=hk)
                xs = [r["s"] for r in sel]
                for key, _, colour in IMPLEMENTATIONS:
                    ax.plot(xs, [r[f"{key}_gflops"] for r in sel], color=colour,
                            linestyle=KV_HEAD_STYLES.get(hk, ":"), marker=".")
            if peak_gflops is not None:
                ax.axhline(peak_gflops, color="grey", linewidth=1)
            ax.set_title(f"{dtype}, {mask}, D {d}", fontsize=9)
            ax.set_ylabel("GFLOP/s")
            ax.set_ylim(bottom=0)
        speedup = row_axes[-1]
        for d in head_dims:
            for hk in kv_heads:
                sel = _series(rows, dtype=dtype, causal=causal, d=d, hk=hk)
                speedup.plot([r["s"] for r in sel], [r["sdpa_s"] / r["anyattn_s"] for r in sel],
                             color=IMPLEMENTATIONS[0][2], linestyle=KV_HEAD_STYLES.get(hk, ":"),
                             marker=HEAD_DIM_MARKERS.get(d, "x"))
        speedup.axhline(1.0, color="black", linestyle=":", linewidth=1)
        speedup.set_title(f"{dtype}, {mask}: anyattn / SDPA speed", fontsize=9)
        speedup.set_ylabel("x torch SDPA (flash)")
        speedup.set_ylim(bottom=0)
        for ax in row_axes:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_xlabel("sequence length")
            ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=colour, label=label) for _, label, colour in IMPLEMENTATIONS]
    handles += [Line2D([], [], color="black", linestyle=KV_HEAD_STYLES.get(hk, ":"),
                       label=f"Hq 16 / Hk {hk}") for hk in kv_heads]
    handles += [Line2D([], [], color="black", linestyle="none", marker=HEAD_DIM_MARKERS.get(d, "x"),
                       label=f"D {d} (speed-up panels)") for d in head_dims]
    if peak_gflops is not None:
        handles.append(Line2D([], [], color="grey", label=f"{peak_label}: {peak_gflops:.0f} GFLOP/s"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def save_plot(rows: Sequence[Dict[str, object]], path: str, peak_gflops: Optional[float],
              peak_label: str) -> bool:
    """Write the figure to ``path`` as PNG. False (nothing written) without matplotlib."""
    try:
        fig = build_figure(rows, peak_gflops, peak_label)
    except ImportError:
        return False
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
    return True
