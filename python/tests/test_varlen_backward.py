"""Autograd of flash_attn_varlen_func and its packed forms: gradients against float64 torch
autograd run per sequence, by the 2x rule, with seqused_k, GQA, ALiBi, sinks and dropout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _dropout  # noqa: E402
from torch_reference import attention_torch, grads_2x, leaf, naive_gradients  # noqa: E402

LENS_Q = [5, 0, 17, 9]
LENS_K = [8, 3, 12, 20]
OPTS = dict(causal=True, window=(7, 0), softcap=4.0)


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def _data(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(LENS_Q), sum(LENS_K)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).double()

    return (r(tq, 4, 24), r(tk, 2, 24), r(tk, 2, 16), r(tq, 4, 16),
            torch.randn(4, generator=g, dtype=torch.float64),
            torch.rand(len(LENS_Q), 4, generator=g, dtype=torch.float64) * 0.2)


def _per_sequence(fn, q, k, v, dout, used, alibi, keep=None):
    """Concatenates fn(q_b, k_b, v_b, dout_b, alibi_b, keep_b) gradients over the sequences."""
    cq, ck = _cu(LENS_Q), _cu(LENS_K)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsinks = torch.zeros(q.shape[1], dtype=torch.float64)
    for b in range(len(LENS_Q)):
        q0, q1, k0 = int(cq[b]), int(cq[b + 1]), int(ck[b])
        k1 = k0 + used[b]
        kb = None if keep is None else keep[b:b + 1, :, :q1 - q0, :k1 - k0]
        g = fn(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1], alibi[b], kb)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
        dsinks += g[3].double()
    return {"dq": dq, "dk": dk, "dv": dv, "dsinks": dsinks}


@pytest.mark.parametrize("dtype,p", [("bfloat16", 0.0), ("float16", 0.0), ("bfloat16", 0.3)])
def test_varlen_gradients_match_per_sequence_reference(dtype, p):
    tdtype = getattr(torch, dtype)
    q, k, v, dout, sinks, alibi = _data(tdtype)
    used = [8, 2, 12, 15]
    ins = [leaf(x, tdtype) for x in (q, k, v)] + [leaf(sinks, torch.float32)]
    torch.manual_seed(5)
    out = anyattn.flash_attn_varlen_func(
        *ins[:3], _cu(LENS_Q), _cu(LENS_K), max(LENS_Q), max(LENS_K), dropout_p=p,
        causal=True, window_size=(7, 0), softcap=4.0, alibi_slopes=alibi.float(), sinks=ins[3],
        seqused_k=torch.tensor(used, dtype=torch.int32))
    got = dict(zip(["dq", "dk", "dv", "dsinks"], torch.autograd.grad(out, ins, dout.to(tdtype))))
    keep = None
    if p > 0:  # the mask of sequence b is batch b's, positions within the sequence
        torch.manual_seed(5)
        keep = _dropout.keep_mask(len(LENS_Q), max(LENS_Q), 4, max(LENS_K), p,
                                  _dropout.draw_rng_state())

    def ref(qb, kb, vb, dob, slopes, kp):
        xs = [leaf(x, torch.float64) for x in (qb, kb, vb, sinks)]
        o = attention_torch(*xs[:3], sinks=xs[3], alibi=slopes, keep=kp, dropout_p=p, **OPTS)
        return torch.autograd.grad(o, xs, dob) if o.numel() else [torch.zeros_like(x) for x in xs]

    def naive(qb, kb, vb, dob, slopes, kp):
        g = naive_gradients(qb, kb, vb, dob, dtype=tdtype, sinks=sinks, alibi=slopes, keep=kp,
                            dropout_p=p, **OPTS)
        return g

    grads_2x(got, _per_sequence(ref, q, k, v, dout, used, alibi, keep),
             _per_sequence(naive, q, k, v, dout, used, alibi, keep), dtype)
    # Keys beyond seqused_k get exact zeros.
    assert torch.count_nonzero(got["dk"][int(_cu(LENS_K)[1]) + 2:int(_cu(LENS_K)[2])]) == 0


def test_varlen_qkvpacked_gradient_flows_into_the_packed_tensor():
    g = torch.Generator().manual_seed(2)
    lens = [6, 11]
    cu = _cu(lens)
    qkv = torch.randn(sum(lens), 3, 2, 16, generator=g).requires_grad_(True)
    dout = torch.randn(sum(lens), 2, 16, generator=g)
    out = anyattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    (dqkv,) = torch.autograd.grad(out, [qkv], dout)
    parts = [qkv.detach()[:, i].clone().requires_grad_(True) for i in range(3)]
    out2 = anyattn.flash_attn_varlen_func(*parts, cu, cu, max(lens), max(lens), causal=True)
    assert torch.equal(out, out2)
    assert torch.equal(dqkv, torch.stack(torch.autograd.grad(out2, parts, dout), dim=1))


def test_varlen_kvpacked_gradients_match_dense_per_sequence():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(9, 4, 16, generator=g).requires_grad_(True)
    kv = torch.randn(9, 2, 2, 16, generator=g).requires_grad_(True)
    dout = torch.randn(9, 4, 16, generator=g)
    cu = _cu([4, 5])
    out = anyattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 5, 5)
    dq, dkv = torch.autograd.grad(out, [q, kv], dout)
    for b in range(2):
        s = slice(int(cu[b]), int(cu[b + 1]))
        qb = q.detach()[None, s].clone().requires_grad_(True)
        kvb = kv.detach()[None, s].clone().requires_grad_(True)
        ob = anyattn.flash_attn_kvpacked_func(qb, kvb)
        gq, gkv = torch.autograd.grad(ob, [qb, kvb], dout[None, s])
        torch.testing.assert_close(dq[s], gq[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(dkv[s], gkv[0], rtol=1e-5, atol=1e-6)


def test_opcheck_varlen_ops_with_autograd():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(9, 2, 8, generator=g).requires_grad_(True)
    k = torch.randn(7, 1, 8, generator=g).requires_grad_(True)
    v = torch.randn(7, 1, 8, generator=g).requires_grad_(True)
    args = (q, k, v, _cu([4, 5]), _cu([3, 4]), None, 5, 4, 0.0, 0.0, True, -1, -1, None,
            torch.zeros(2, requires_grad=True), 0.1, torch.tensor([3, 4], dtype=torch.int64))
    result = torch.library.opcheck(torch.ops.anyattn.fwd_varlen.default, args)
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse = torch.ops.anyattn.fwd_varlen(*args)
    bargs = (torch.randn(out.shape, generator=g), q.detach(), k.detach(), v.detach(),
             out.detach(), lse, *args[3:14], args[14].detach(), *args[15:])
    result = torch.library.opcheck(torch.ops.anyattn.bwd_varlen.default, bargs)
    assert set(result.values()) == {"SUCCESS"}, result
