"""torch integration: the anyattn::fwd op (opcheck), torch.compile, autograd behaviour, GIL release."""

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


def test_compiled_call_uses_the_anyattn_op():
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    q = torch.randn(1, 8, 2, 16)
    fn = torch.compile(lambda a: anyattn.flash_attn_func(a, a, a, causal=True), backend=backend, fullgraph=True)
    torch.testing.assert_close(fn(q), anyattn.flash_attn_func(q, q, q, causal=True), rtol=0, atol=0)
    assert any("anyattn.fwd" in t for t in seen), seen


def test_forward_with_grad_inputs_works_and_backward_raises():
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    out = anyattn.flash_attn_func(q, q, q)
    assert out.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(out.detach(), anyattn.flash_attn_func(q, q, q), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="no backward pass"):
        out.sum().backward()


def test_gil_is_released_during_kernels():
    q = torch.randn(1, 3000, 8, 64)
    before = anyattn.get_num_threads()
    anyattn.set_num_threads(1)
    try:
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
