"""torch integration: the anyattn::fwd op (opcheck), torch.compile (inference and a training
step), GIL release."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402


def _samples():
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    yield (r(2, 5, 4, 16), r(2, 7, 2, 16), r(2, 7, 2, 8), 0.0, 0.0, True, -1, -1, None, None)
    yield (r(1, 9, 2, 32, dtype=torch.bfloat16), r(1, 4, 1, 32, dtype=torch.bfloat16),
           r(1, 4, 1, 32, dtype=torch.bfloat16), 0.25, 3.0, False, 2, 1, torch.rand(2), torch.randn(2))
    q = r(1, 6, 3, 8, 16, dtype=torch.float16)
    yield (q[:, :, 0], q[:, :, 1], q[:, :, 2], 0.0, 0.0, False, -1, 0, torch.rand(1, 8), None)
    # Differentiable inputs (opcheck then also checks the autograd registration), with dropout.
    yield (r(1, 6, 2, 16).requires_grad_(), r(1, 8, 2, 16).requires_grad_(),
           r(1, 8, 2, 8).requires_grad_(), 0.0, 2.0, True, -1, -1, None,
           r(2).requires_grad_(), 0.2, torch.tensor([7, 9], dtype=torch.int64))


@pytest.mark.parametrize("args", list(_samples()))
def test_opcheck(args):
    result = torch.library.opcheck(torch.ops.anyattn.fwd.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


class _TinyAttention(torch.nn.Module):
    """A block that projects, attends with anyattn in (B, S, H, D) and projects back."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, dim = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads)
        out = anyattn.flash_attn_qkvpacked_func(qkv, causal=True, window_size=(7, -1))
        return self.proj(out.reshape(b, s, dim))


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    module = _TinyAttention().eval()
    x = torch.randn(2, 33, 64)
    with torch.no_grad():
        eager = module(x)
        compiled = torch.compile(module, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


class _TinyBlock(torch.nn.Module):
    """Projections around anyattn attention with learnable sinks, for a training step."""

    def __init__(self, dim=32, heads=4, dropout_p=0.0):
        super().__init__()
        self.heads, self.dropout_p = heads, dropout_p
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.sinks = torch.nn.Parameter(torch.zeros(heads))

    def forward(self, x):
        b, s, dim = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads)
        out = anyattn.flash_attn_qkvpacked_func(qkv, dropout_p=self.dropout_p, causal=True,
                                                 sinks=self.sinks)
        return self.proj(out.reshape(b, s, dim))


def _train(module, steps, x, target, seed=0):
    """Runs SGD steps; returns the losses and the final parameters."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    losses = []
    torch.manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        loss = (module(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach().clone() for p in module.parameters()]


def _compiled_training(dropout_p, backend):
    torch.manual_seed(0)
    eager = _TinyBlock(dropout_p=dropout_p)
    compiled = _TinyBlock(dropout_p=dropout_p)
    compiled.load_state_dict(eager.state_dict())
    x, target = torch.randn(2, 17, 32), torch.randn(2, 17, 32)
    graphs = []

    def record(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    from functorch.compile import make_boxed_func  # noqa: PLC0415
    from torch._dynamo.backends.common import aot_autograd  # noqa: PLC0415

    if backend == "record":
        backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    runner = torch.compile(compiled, fullgraph=True, backend=backend)
    return _train(eager, 3, x, target), _train(runner, 3, x, target), graphs, eager


def test_torch_compile_training_step_matches_eager():
    """A compiled (inductor, fullgraph) forward + backward, then an optimizer step, three times."""
    (loss_e, params_e), (loss_c, params_c), _, eager = _compiled_training(0.0, "inductor")
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    assert loss_e[-1] < loss_e[0]
    for a, b in zip(params_c, params_e):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert eager.sinks.grad is not None and eager.sinks.grad.abs().sum() > 0


def test_compiled_backward_graph_calls_anyattn_bwd_and_dropout_matches_eager():
    """With AOTAutograd the backward graph holds anyattn::bwd; with dropout the seeds come from
    the default generator inside the graph, so the same torch.manual_seed gives eager's result."""
    (loss_e, params_e), (loss_c, params_c), graphs, _ = _compiled_training(0.2, "record")
    assert any("anyattn.fwd" in t for g in graphs for t in g), graphs
    assert any("anyattn.bwd" in t for g in graphs for t in g), graphs
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    for a, b in zip(params_c, params_e):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_call_uses_the_anyattn_op():
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    q = torch.randn(1, 8, 2, 16)
    fn = torch.compile(lambda a: anyattn.flash_attn_func(a, a, a, causal=True), backend=backend, fullgraph=True)
    torch.testing.assert_close(fn(q), anyattn.flash_attn_func(q, q, q, causal=True), rtol=0, atol=0)
    assert any("anyattn.fwd" in t for t in seen), seen


def test_gil_is_released_during_kernels():
    before = anyattn.get_num_threads()
    anyattn.set_num_threads(1)
    try:
        # A kernel long enough for a stalled ticker to show, on slow and fast machines alike: the
        # sequence doubles (four times the work) until one call takes 0.2 s.
        seqlen = 1500
        kernel_s = 0.0
        while kernel_s < 0.2 and seqlen < 48000:
            seqlen *= 2
            q = torch.randn(1, seqlen, 8, 64)
            start = time.perf_counter()
            anyattn.flash_attn_func(q, q, q)
            kernel_s = time.perf_counter() - start
        gaps = []

        def ticker(stop):
            last = time.perf_counter()
            while not stop.is_set():
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                time.sleep(0.001)

        stop = threading.Event()
        t = threading.Thread(target=ticker, args=(stop,))
        t.start()
        time.sleep(0.01)
        anyattn.flash_attn_func(q, q, q)
        stop.set()
        t.join()
    finally:
        anyattn.set_num_threads(before)
    assert kernel_s > 0.1, "kernel too fast for the check to mean anything"
    # With the GIL held the ticker would stall for the whole kernel.
    assert max(gaps) < kernel_s / 2, (max(gaps), kernel_s)


def test_numpy_and_torch_agree_bitwise():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in [(2, 9, 4, 24), (2, 11, 2, 24), (2, 11, 2, 24)])
    a = anyattn.flash_attn_func(q, k, v, softcap=2.0)
    b = anyattn.flash_attn_func(*(torch.from_numpy(x) for x in (q, k, v)), softcap=2.0)
    np.testing.assert_array_equal(a, b.numpy())
