"""Attention dropout on CPU torch tensors: keep rate, the forward and the backward against the
float64 reference with the library's own keep mask, the S_dmask pattern, reproducibility from
torch.manual_seed, and independence from the thread counts."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _dropout  # noqa: E402
from reference import check_2x, out_eps  # noqa: E402
from torch_reference import attention_torch, grads_2x, leaf, naive_gradients  # noqa: E402


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p_within_5_sigma(p):
    n = 2 * 4 * 96 * 160
    keep = _dropout.keep_mask(2, 96, 4, 160, p, torch.tensor([1234, 5], dtype=torch.int64))
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma


def test_keep_mask_depends_on_seed_and_offset_only():
    rng = torch.tensor([99, 1], dtype=torch.int64)
    a = _dropout.keep_mask(1, 20, 2, 30, 0.3, rng)
    # The mask of a real call (other scores, a causal mask) shows the same pattern on visible keys.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20 if i == 0 else 30, 2, 8, generator=g) for i in range(3))
    s = _dropout.dropout_pattern(q, k, (0.0, 0.0, False, -1, -1, None, None), 0.3, rng)
    assert torch.equal(~torch.signbit(s), a)
    assert not torch.equal(a, _dropout.keep_mask(1, 20, 2, 30, 0.3, rng + torch.tensor([0, 1])))
    assert not torch.equal(a, _dropout.keep_mask(1, 20, 2, 30, 0.3, rng + torch.tensor([1, 0])))


def _problem(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 23, 4, 32, generator=g, dtype=torch.float64).to(dtype).double()
    k = torch.randn(2, 29, 2, 32, generator=g, dtype=torch.float64).to(dtype).double()
    v = torch.randn(2, 29, 2, 16, generator=g, dtype=torch.float64).to(dtype).double()
    dout = torch.randn(2, 23, 4, 16, generator=g, dtype=torch.float64).to(dtype).double()
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    return q, k, v, dout, sinks


OPTS = dict(causal=True, window=(10, 0), softcap=5.0)


def _api(q, k, v, sinks, p, dtype, return_probs=False):
    return anyattn.flash_attn_func(q.to(dtype), k.to(dtype), v.to(dtype), dropout_p=p,
                                   causal=True, window_size=(10, 0), softcap=5.0,
                                   sinks=sinks.float(), return_attn_probs=return_probs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_and_backward_match_reference_with_the_same_mask(dtype):
    """Forward/backward consistency: with the keep mask read back from the library, the dropout
    forward and its gradients (q, k, v, sinks) match the float64 reference by the 2x rule."""
    tdtype = getattr(torch, dtype)
    p = 0.3
    q, k, v, dout, sinks = _problem(tdtype)
    ins = [leaf(x, tdtype) for x in (q, k, v)] + [leaf(sinks, torch.float32)]
    torch.manual_seed(42)
    out, _, s_dmask = _api(*ins, p, tdtype, return_probs=True)
    keep = ~torch.signbit(s_dmask[:, :, :q.shape[1], :k.shape[1]])  # flash-attn pads to 128s
    got = dict(zip(["dq", "dk", "dv", "dsinks"], torch.autograd.grad(out, ins, dout.to(tdtype))))

    ins64 = [leaf(x, torch.float64) for x in (q, k, v, sinks)]
    out64 = attention_torch(*ins64[:3], sinks=ins64[3], keep=keep, dropout_p=p, **OPTS)
    ref = dict(zip(["dq", "dk", "dv", "dsinks"], torch.autograd.grad(out64, ins64, dout)))
    naive_out = attention_torch(*(x.to(tdtype) for x in (q, k, v)), sinks=sinks.to(tdtype),
                                keep=keep, dropout_p=p, **OPTS)
    check_2x("out", out.double().detach().numpy(), out64.detach().numpy(),
             naive_out.double().detach().numpy(), out_eps(dtype, out64.detach().numpy()))
    naive = dict(zip(["dq", "dk", "dv", "dsinks"], naive_gradients(
        q, k, v, dout, dtype=tdtype, sinks=sinks, keep=keep, dropout_p=p, **OPTS)))
    grads_2x(got, ref, naive, dtype)
    # Dropout really happened: the result differs from the p = 0 output.
    assert not torch.allclose(out, _api(q, k, v, sinks, 0.0, tdtype), atol=1e-2)


def test_attn_probs_pattern_holds_probabilities_and_mask():
    q, k, v, _, sinks = _problem()
    torch.manual_seed(1)
    _, lse, s_dmask = _api(q, k, v, sinks, 0.25, torch.float32, return_probs=True)
    # flash-attn's shape: padded to multiples of 128, the padding zero.
    assert s_dmask.shape == (2, 4, 128, 128) and s_dmask.dtype == torch.float32
    assert not s_dmask[:, :, 23:].any() and not s_dmask[..., 29:].any()
    s_dmask = s_dmask[:, :, :23, :29]
    ins = [x.float() for x in (q, k, v)]
    probs = s_dmask.abs().double()  # |S| = P
    _, lse64 = attention_torch(*(x.double() for x in ins), sinks=sinks, return_lse=True, **OPTS)
    torch.testing.assert_close(lse.double(), lse64, rtol=0, atol=1e-5)
    # Rows of P plus the sink probability sum to 1.
    p_sink = torch.exp(sinks[None, :, None] - lse64)
    torch.testing.assert_close(probs.sum(-1) + p_sink, torch.ones_like(p_sink), rtol=0, atol=1e-5)
    keep = ~torch.signbit(s_dmask)
    assert 0.6 < keep.float().mean().item() < 0.9


def test_manual_seed_reproduces_and_new_draws_differ():
    q, k, v, dout, sinks = _problem()

    def run(seed):
        torch.manual_seed(seed)
        ins = [leaf(x, torch.float32) for x in (q, k, v)]
        out = _api(*ins, sinks, 0.4, torch.float32)
        return (out,) + torch.autograd.grad(out, ins, dout.float())

    a, b, c = run(3), run(3), run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    torch.manual_seed(3)
    first = _api(q, k, v, sinks, 0.4, torch.float32)
    second = _api(q, k, v, sinks, 0.4, torch.float32)
    assert not torch.equal(first, second)  # each call draws a fresh seed


def test_results_do_not_depend_on_thread_counts():
    q, k, v, dout, sinks = _problem(torch.bfloat16, seed=5)
    results = []
    before_any, before_torch = anyattn.get_num_threads(), torch.get_num_threads()
    try:
        for any_threads, torch_threads in [(1, 1), (2, 2), (3, 1), (1, 2)]:
            anyattn.set_num_threads(any_threads)
            torch.set_num_threads(torch_threads)
            torch.manual_seed(11)
            ins = [leaf(x, torch.bfloat16) for x in (q, k, v)] + [leaf(sinks, torch.float32)]
            out = _api(*ins, 0.3, torch.bfloat16)
            results.append((out,) + torch.autograd.grad(out, ins, dout.bfloat16()))
    finally:
        anyattn.set_num_threads(before_any)
        torch.set_num_threads(before_torch)
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], other))


def test_numpy_dropout_is_rejected():
    q = torch.zeros(1, 3, 2, 8).numpy()
    with pytest.raises(NotImplementedError, match="numpy inputs"):
        anyattn.flash_attn_func(q, q, q, dropout_p=0.1)
