"""Smoke test of bench/torch_sdpa.py: one forward and one backward row against torch, through the
ctypes mirror of the C ABI (bench/anyattn_ctypes.py), on the library the C++ build produced.

The script's figures are timings (not checked here); what is checked is that both calls ran, the
ratio was computed and the outputs agree with torch's to float32 rounding, so a change of the C
structs that the mirror misses, or a broken call, fails here rather than in a benchmark run.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(REPO, "build", "release", "src", "libanyattn.so")


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="needs the Release build's libanyattn.so")
def test_torch_sdpa_forward_and_backward_rows(tmp_path):
    result_path = tmp_path / "torch_sdpa.json"
    command = [sys.executable, os.path.join(REPO, "bench", "torch_sdpa.py"), "--lib", LIBRARY,
               "--quick", "--threads-list", "1", "--target-seconds", "0.01", "--min-runs", "1",
               "--filter", "fwd/f32/full/B1/Hq16/Hk4/D64/S1024",
               "--filter", "bwd/f32/causal/B1/Hq16/Hk4/D64/S1024",
               "--json", str(result_path), "--png", str(tmp_path / "torch_sdpa.png")]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = json.loads(result_path.read_text())["rows"]
    assert sorted(row["kind"] for row in rows) == ["bwd", "fwd"]
    for row in rows:
        assert "anyattn_error" not in row and "torch_error" not in row, row
        assert row["speedup_vs_torch_sdpa"] > 0
        # f32 inputs in [-1, 1): outputs and gradients agree with torch's to rounding.
        assert row["max_abs_diff_vs_torch_sdpa"] < 1e-4, row
