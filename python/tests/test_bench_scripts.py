"""Smoke tests of the peer comparisons: bench/torch_sdpa.py (one forward and one backward row
against torch, and rows of its never-slower sweep: a varlen batch and a head dim of 1) and
bench/ggml_fa.py (one forward and one decode row against ggml, and a sweep row), through the
ctypes mirror of the C ABI (bench/anyattn_ctypes.py), on the library the C++ build produced; and
bench/mixed_batch.py (a small mix of prefill chunks and decode steps against torch SDPA), through
the installed package.

The scripts' figures are timings (not checked here); what is checked is that both calls ran, the
ratio was computed and the outputs agree with the peer's, so a change of the C structs that the
mirror misses, or a broken call, fails here rather than in a benchmark run.
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(REPO, "build", "release", "src", "libanyattn.so")


def run_comparison(script, tmp_path, extra_args, stdout=None):
    """Runs bench/<script>.py on one thread with the shortest timings and extra_args; asserts that
    it exits 0 and returns the rows of its JSON (and appends its output to the list `stdout`)."""
    result_path = tmp_path / f"{script}.json"
    command = [sys.executable, os.path.join(REPO, "bench", f"{script}.py"), "--lib", LIBRARY,
               "--quick", "--threads-list", "1", "--target-seconds", "0.01", "--min-runs", "1",
               "--json", str(result_path)] + extra_args
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    if stdout is not None:
        stdout.append(completed.stdout)
    return json.loads(result_path.read_text())["rows"]


def assert_rows_ran_and_agree(rows, peer, f32_bound, other_bound):
    """Both calls of every row ran, the ratio was computed, and the outputs differ by less than
    f32_bound (f32 rows) or other_bound (rows of other dtypes)."""
    for row in rows:
        assert "anyattn_error" not in row and f"{peer}_error" not in row, row
        assert row[f"speedup_vs_{peer}"] > 0
        bound = f32_bound if row["dtype"] == "f32" else other_bound
        assert row[f"max_abs_diff_vs_{peer}"] < bound, row


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="needs the Release build's libanyattn.so")
def test_torch_sdpa_forward_and_backward_rows(tmp_path):
    pytest.importorskip("torch")
    rows = run_comparison("torch_sdpa", tmp_path,
                          ["--filter", "fwd/f32/full/B1/Hq16/Hk4/D64/S1024",
                           "--filter", "bwd/f32/causal/B1/Hq16/Hk4/D64/S1024",
                           "--png", str(tmp_path / "torch_sdpa.png")])
    assert sorted(row["kind"] for row in rows) == ["bwd", "fwd"]
    for row in rows:
        assert "anyattn_error" not in row and "torch_sdpa_error" not in row, row
        assert row["speedup_vs_torch_sdpa"] > 0
        # f32 inputs in [-1, 1): outputs and gradients agree with torch's to rounding.
        assert row["max_abs_diff_vs_torch_sdpa"] < 1e-4, row


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="needs the Release build's libanyattn.so")
def test_torch_sdpa_sweep_rows(tmp_path):
    pytest.importorskip("torch")
    output = []
    rows = run_comparison("torch_sdpa", tmp_path,
                          ["--sweep", "--filter", "varlen/f32/causal/B64/Hq8/Hk8/D64",
                           "--filter", "fwd/bf16/full/B1/Hq8/Hk8/D1/S256"], output)
    assert sorted(row["key"] for row in rows) == ["fwd/bf16/full/B1/Hq8/Hk8/D1/S256",
                                                   "varlen/f32/causal/B64/Hq8/Hk8/D64/Smax127"]
    # Inputs in [-1, 1): f32 outputs agree to rounding, bf16 outputs to the rounding of each side's
    # bf16 result.
    assert_rows_ran_and_agree(rows, "torch_sdpa", 1e-5, 8e-3)
    worst = min(rows, key=lambda row: row["speedup_vs_torch_sdpa"])
    assert f"worst ratio over 2 rows: {worst['speedup_vs_torch_sdpa']:.2f}x torch_sdpa at " \
        f"{worst['key']}" in output[0]


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="needs the Release build's libanyattn.so")
def test_ggml_fa_forward_and_decode_rows(tmp_path):
    pytest.importorskip("ggml")
    rows = run_comparison("ggml_fa", tmp_path,
                          ["--dtypes", "f32,f16",
                           "--filter", "fwd/f32/causal/B1/Hq16/Hk4/D64/S1024",
                           "--filter", "decode/f16/B1/Hq32/Hk8/D128/Sk4096"])
    assert sorted(row["key"] for row in rows) == ["decode/f16/B1/Hq32/Hk8/D128/Sk4096",
                                                   "fwd/f32/causal/B1/Hq16/Hk4/D64/S1024"]
    # Inputs in [-1, 1): f32 outputs agree to rounding; in the f16 row ggml rounds q to f16 and
    # sums its output in f16 (a few units of 2^-11), anyattn rounds its output once.
    assert_rows_ran_and_agree(rows, "ggml", 1e-5, 2e-3)


def test_mixed_batch_rows(tmp_path):
    pytest.importorskip("torch")
    result_path = tmp_path / "mixed_batch.json"
    command = [sys.executable, os.path.join(REPO, "bench", "mixed_batch.py"), "--threads-list",
               "1", "--dtypes", "f32,bf16", "--mix", "1x20@40,2x4@33,3x1@70", "--target-seconds",
               "0.01", "--min-runs", "1", "--json", str(result_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = json.loads(result_path.read_text())["rows"]
    assert [(row["dtype"], row["sequences"]) for row in rows] == [("f32", 6), ("bf16", 6)]
    for row in rows:
        assert not any(key.endswith("_error") for key in row), row
        assert row["split_over_mixed"] > 0 and row["sdpa_over_mixed"] > 0
        # Inputs in [-1, 1): f32 outputs agree to rounding; bf16 outputs differ by the rounding of
        # each side's bf16 result (2^-9 of values below 1).
        bound = 1e-5 if row["dtype"] == "f32" else 8e-3
        assert row["max_abs_diff_vs_sdpa"] < bound, row


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="needs the Release build's libanyattn.so")
def test_ggml_fa_sweep_row(tmp_path):
    pytest.importorskip("ggml")
    rows = run_comparison("ggml_fa", tmp_path, ["--sweep", "--dtypes", "f32",
                                                "--filter", "fwd/f32/causal/B1/Hq8/Hk8/D257/S256"])
    assert [row["key"] for row in rows] == ["fwd/f32/causal/B1/Hq8/Hk8/D257/S256"]
    assert_rows_ran_and_agree(rows, "ggml", 1e-5, 1e-5)
