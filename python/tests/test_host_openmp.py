"""anyattn's parallel phases on torch's OpenMP team (python/src/host_openmp.cc): importing anyattn
with torch loaded routes them through the OpenMP runtime torch loaded (anyattn_set_host_parallel),
unless ANYATTN_HOST_OPENMP=0. The results are the library pool's, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import anyattn
from anyattn import _core


@pytest.fixture
def pool_then_openmp():
    """Restores the import-time choice (on torch's team) after the test."""
    yield
    _core.use_host_openmp(True)


def _calls():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 150, 8, 64, generator=g, dtype=torch.float32)
    k = torch.randn(2, 150, 2, 64, generator=g, dtype=torch.float32)
    v = torch.randn(2, 150, 2, 64, generator=g, dtype=torch.float32)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))

    def backward():
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        anyattn.flash_attn_func(qg, kg, vg, causal=True).square().sum().backward()
        return [qg.grad, kg.grad, vg.grad]

    return {
        "dense": lambda: [anyattn.flash_attn_func(q, k, v, causal=True)],
        "varlen": lambda: [anyattn.flash_attn_varlen_func(
            q.reshape(300, 8, 64), k.reshape(300, 2, 64), v.reshape(300, 2, 64), cu, cu, 200,
            200, causal=True)],
        "kvcache bf16 decode": lambda: [anyattn.flash_attn_with_kvcache(
            qb[:, :1], kb, vb, cache_seqlens=torch.tensor([150, 77], dtype=torch.int32))],
        "backward": backward,
    }


def test_import_with_torch_runs_on_its_openmp_runtime():
    path = _core.host_openmp()
    assert path is not None and os.path.basename(path).startswith(("libgomp", "libomp",
                                                                      "libiomp5"))
    assert _core.use_host_openmp(True) == path


@pytest.mark.parametrize("threads", [2, 3])
def test_openmp_team_gives_the_pools_bits(pool_then_openmp, threads):
    before = anyattn.get_num_threads()
    anyattn.set_num_threads(threads)
    try:
        for name, call in _calls().items():
            _core.use_host_openmp(False)
            expected = call()
            assert _core.use_host_openmp(True) is not None
            got = call()
            for a, b in zip(expected, got):
                assert torch.equal(a, b), name
    finally:
        anyattn.set_num_threads(before)


def test_environment_variable_keeps_the_pool():
    code = ("import torch, anyattn; from anyattn import _core; "
            "print(_core.host_openmp() is None)")
    for value, expected in (("0", "True"), ("1", "False")):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env={**os.environ, "ANYATTN_HOST_OPENMP": value}, check=True)
        assert result.stdout.strip() == expected


def test_a_forked_child_runs_on_the_pool():
    """GNU OpenMP's team does not survive fork(): the child takes the library's pool."""
    q = torch.randn(1, 200, 4, 32)
    expected = anyattn.flash_attn_func(q, q, q, causal=True)  # the parent's team has run
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the call is right and ran on the pool
        ok = False
        try:
            ok = (_core.host_openmp() is None
                  and torch.equal(anyattn.flash_attn_func(q, q, q, causal=True), expected))
        finally:
            os._exit(0 if ok else 1)
    for _ in range(600):  # a minute
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    pytest.fail("the forked child did not finish its call within a minute")
