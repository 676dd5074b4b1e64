"""ring-flash-attn 0.1.8 (PyPI) on CPU through anyattn's flash-attn layer, over gloo on loopback.

For 2 and 3 ranks, one run of worker processes (bench/ring_launch.py) calls anyattn's
install_as_flash_attn() and then ring_flash_attn_func, zigzag_ring_flash_attn_func and
llama3_flash_attn_varlen_func (ring_cases.CASES: causal and not; bf16, f16, and f32 for llama3;
GQA and MQA), forward and backward, each rank on its shard of one sequence. Every rank's out, LSE,
dq, dk and dv are checked against the same positions of one single-process anyattn call over the
whole sequence by flash-attn's rule: max|ring - ref64| <= 2 * max|anyattn - ref64| + eps, ref64
being float64 torch autograd (torch_reference.attention_torch) and eps the repository's
(reference.out_eps, reference.lse_eps). A last test checks that a failing rank fails the run with
its traceback instead of hanging its peers.

ring-flash-attn and the transformers 4.x it imports live in build/ring-deps
(scripts/setup.sh --python, function install_ring_flash_attn_deps); without them these tests skip.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from reference import check_2x, lse_eps, out_eps  # noqa: E402
from ring_cases import CASES, RingCase, cu_seqlens, full_inputs, local_positions  # noqa: E402
from torch_reference import attention_torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench"))
from ring_launch import RankFailure, ring_deps_dir, ring_deps_installed, run_ranks  # noqa: E402

pytestmark = pytest.mark.skipif(
    not ring_deps_installed(),
    reason=f"ring-flash-attn is not installed in {ring_deps_dir()}: run scripts/setup.sh --python "
    "(its install_ring_flash_attn_deps step installs ring-flash-attn 0.1.8 and transformers 4.x)")

WORLD_SIZES = (2, 3)
# One run covers every case; worker start-up (torch, transformers) dominates on a 2-core machine.
RUN_TIMEOUT_S = 150
GRADIENTS = ("dq", "dk", "dv")


@functools.lru_cache(maxsize=None)
def _ring_run(world_size: int):
    """Per-rank results of ring_cases.run_rank over every case, or the RankFailure it raised
    (kept, so that each case's test reports it without starting the processes again)."""
    try:
        return run_ranks(world_size, "ring_cases:run_rank", timeout_s=RUN_TIMEOUT_S)
    except RankFailure as failure:
        return failure


def _leaves(case: RingCase, dtype: torch.dtype):
    inputs = full_inputs(case)
    leaves = [inputs[name].to(dtype).requires_grad_(True) for name in ("q", "k", "v")]
    return leaves, inputs["dout"].to(dtype)


def _results(out, lse, leaves):
    return {"out": out.detach().double(), "lse": lse.detach().double(),
            **{name: x.grad.double() for name, x in zip(GRADIENTS, leaves)}}


@functools.lru_cache(maxsize=None)
def _single_process(case: RingCase):
    """out, lse and gradients of one anyattn call over the whole sequence, in the case's dtype."""
    (q, k, v), dout = _leaves(case, case.torch_dtype)
    if case.varlen:
        cu = cu_seqlens(case)
        out, lse, _ = anyattn.flash_attn_varlen_func(
            q, k, v, cu, cu, max(case.seqlens), max(case.seqlens), causal=case.causal,
            return_attn_probs=True)
    else:
        out, lse, _ = anyattn.flash_attn_func(q, k, v, causal=case.causal, return_attn_probs=True)
    out.backward(dout)
    return _results(out, lse, (q, k, v))


@functools.lru_cache(maxsize=None)
def _reference64(case: RingCase):
    """The same in float64 torch autograd; packed sequences attend within themselves only."""
    (q, k, v), dout = _leaves(case, torch.float64)
    if case.varlen:
        outs, lses = [], []
        bounds = cu_seqlens(case).tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, lse = attention_torch(q[None, start:end], k[None, start:end], v[None, start:end],
                                       causal=case.causal, return_lse=True)
            outs.append(out[0])
            lses.append(lse[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    else:
        out, lse = attention_torch(q, k, v, causal=case.causal, return_lse=True)
    out.backward(dout)
    return _results(out, lse, (q, k, v))


def _local(case: RingCase, name: str, tensor: torch.Tensor, positions: torch.Tensor):
    """The rank's part of a full-sequence result: LSE has the sequence last, (B, H, S) or
    (H, total); the others have it first (varlen) or second (dense)."""
    if name == "lse":
        return tensor[..., positions].numpy()
    return (tensor[positions] if case.varlen else tensor[:, positions]).numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("world_size", WORLD_SIZES, ids=lambda n: f"{n}ranks")
def test_ring_matches_single_process(world_size, case):
    run = _ring_run(world_size)
    if isinstance(run, RankFailure):
        pytest.fail(str(run), pytrace=False)
    single, ref64 = _single_process(case), _reference64(case)
    for rank, rank_results in enumerate(run):
        got = rank_results[case.name]
        positions = local_positions(case, rank, world_size)
        for name in ("out", "lse") + GRADIENTS:
            ref = _local(case, name, ref64[name], positions)
            eps = lse_eps(ref) if name == "lse" else out_eps(case.dtype, ref)
            assert got[name].shape == ref.shape, (rank, name)
            check_2x(f"rank {rank} {name}", got[name], ref,
                     _local(case, name, single[name], positions), eps)


def test_failing_rank_fails_the_run_with_its_traceback():
    started = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 fails on purpose") as failure:
        run_ranks(2, "ring_cases:fail_on_rank_one", timeout_s=RUN_TIMEOUT_S)
    assert "Traceback" in str(failure.value)
    # The waiting rank 0 was ended once rank 1 reported, not left to gloo's timeout.
    assert time.monotonic() - started < RUN_TIMEOUT_S / 2
