"""anyattn's parallel phases on torch's OpenMP team (python/src/host_openmp.cc): importing anyattn
with torch loaded routes them through the OpenMP runtime torch loaded (anyattn_set_host_parallel),
unless ANYATTN_HOST_OPENMP=0 or OMP_WAIT_POLICY=PASSIVE. The results are the library pool's, bit
for bit."""

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


def test_anyattn_runs_on_the_openmp_runtime_torch_loaded():
    """The runtime torch loaded is found; the import took it unless the environment said not to
    (test_environment_variables_choose_the_pool_or_the_team)."""
    chosen = _core.host_openmp()
    path = _core.use_host_openmp(True)
    try:
        assert path is not None and os.path.basename(path).startswith(("libgomp", "libomp",
                                                                          "libiomp5"))
        assert chosen in (None, path)
    finally:
        _core.use_host_openmp(chosen is not None)


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


def test_environment_variables_choose_the_pool_or_the_team():
    """ANYATTN_HOST_OPENMP=0 keeps the pool, =1 takes the team; unset, the team unless torch's
    OpenMP threads sleep between regions (OMP_WAIT_POLICY=PASSIVE)."""
    code = ("import torch, anyattn; from anyattn import _core; "
            "print(_core.host_openmp() is None)")
    base = {k: v for k, v in os.environ.items()
            if k not in ("ANYATTN_HOST_OPENMP", "OMP_WAIT_POLICY")}
    cases = [({"ANYATTN_HOST_OPENMP": "0"}, "True"), ({"ANYATTN_HOST_OPENMP": "1"}, "False"),
             ({}, "False"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "False"),
             ({"OMP_WAIT_POLICY": "passive"}, "True"),
             ({"OMP_WAIT_POLICY": "PASSIVE", "ANYATTN_HOST_OPENMP": "1"}, "False"),
             ({"OMP_WAIT_POLICY": "PASSIVE", "ANYATTN_HOST_OPENMP": "0"}, "True")]
    for extra, expected in cases:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env={**base, **extra}, check=True)
        assert result.stdout.strip() == expected, extra


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
