"""The benchmark figure (anyattn._bench_plot): one colour per implementation in every panel, one
line style per kv-head count, a figure-level legend, the peak line, and a speed-up panel per
(dtype, mask) whose lines are the SDPA/anyattn time ratios of the rows."""

import itertools

import pytest

matplotlib = pytest.importorskip("matplotlib")

from anyattn._bench_plot import IMPLEMENTATIONS, KV_HEAD_STYLES, build_figure, save_plot  # noqa: E402

SEQUENCE_LENGTHS = (512, 1024, 2048)


def _rows():
    rows = []
    for i, (dtype, causal, hk, d, s) in enumerate(itertools.product(
            ("float32", "bfloat16"), (False, True), (16, 4), (64, 128), SEQUENCE_LENGTHS)):
        any_s, sdpa_s, math_s = 1.0 + i, 1.5 + i, 4.0 + i
        flops = 4 * 16 * d * s * s
        rows.append(dict(dtype=dtype, causal=causal, hk=hk, d=d, s=s, anyattn_s=any_s, sdpa_s=sdpa_s,
                         math_s=math_s, anyattn_gflops=flops / any_s / 1e9,
                         sdpa_gflops=flops / sdpa_s / 1e9, math_gflops=flops / math_s / 1e9))
    return rows


def test_figure_layout_colours_styles_legend_and_peak():
    import matplotlib.colors as mcolors

    rows = _rows()
    fig = build_figure(rows, peak_gflops=123.0, peak_label="f32 FMA peak")
    axes = fig.axes
    assert len(axes) == 4 * 3  # (dtype, mask) rows x (D64, D128, speed-up) columns
    colour_of = {key: mcolors.to_rgba(colour) for key, _, colour in IMPLEMENTATIONS}
    for index, ax in enumerate(axes):
        lines = [line for line in ax.get_lines() if list(line.get_xdata()) == list(SEQUENCE_LENGTHS)]
        if index % 3 == 2:  # the speed-up panel: 2 head dims x 2 kv-head counts, anyattn's colour
            assert len(lines) == 4
            assert {mcolors.to_rgba(line.get_color()) for line in lines} == {colour_of["anyattn"]}
            continue
        assert len(lines) == len(KV_HEAD_STYLES) * len(IMPLEMENTATIONS)
        colours = {mcolors.to_rgba(line.get_color()) for line in lines}
        assert colours == set(colour_of.values())
        styles = {line.get_linestyle() for line in lines}
        assert styles == {"-", "--"}
        peak = [line for line in ax.get_lines() if list(line.get_ydata()) == [123.0, 123.0]]
        assert len(peak) == 1
        assert ax.get_legend() is None
    assert len(fig.legends) == 1
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert "anyattn" in labels and "torch SDPA (flash)" in labels and "torch SDPA (math)" in labels
    assert "f32 FMA peak: 123 GFLOP/s" in labels


def test_speedup_panel_plots_the_time_ratio():
    rows = _rows()
    fig = build_figure(rows, peak_gflops=None, peak_label="")
    first_speedup = fig.axes[2]  # bfloat16 without a mask sorts first
    expected = sorted((r for r in rows if (r["dtype"], r["causal"], r["d"], r["hk"]) ==
                       ("bfloat16", False, 64, 16)), key=lambda r: r["s"])
    ratios = [r["sdpa_s"] / r["anyattn_s"] for r in expected]
    plotted = [list(line.get_ydata()) for line in first_speedup.get_lines()]
    assert ratios in plotted


def test_save_plot_writes_a_png(tmp_path):
    path = tmp_path / "bench.png"
    assert save_plot(_rows(), str(path), 100.0, "f32 FMA peak")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
