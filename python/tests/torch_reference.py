"""Differentiable test oracle: the attention contract (docs/semantics.md) in plain torch ops.

``attention_torch`` on float64 inputs is the reference whose torch-autograd gradients the backward
is checked against. ``naive_gradients`` is the other side of flash-attn's 2x rule: the plain
unfused forward and backward in the input dtype, defined exactly as the C++ suite's
(tests/backward/bwd_test_support.cc, ``BwdProblem::naive_same_dtype``): every matmul and row sum
accumulates sequentially in float32 and rounds its result to the dtype, as do the scale, softcap,
ALiBi, the probabilities and each step of the softmax backward. ``grads_2x`` applies the rule.
``randn`` and ``f64`` make and read the tests' inputs.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch

from reference import check_2x, out_eps


def randn(shape, dtype: str, seed: int) -> torch.Tensor:
    """Standard normal values drawn in float64 from a generator seeded with ``seed``, rounded to
    the torch dtype named ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(getattr(torch, dtype))


def f64(x: torch.Tensor) -> np.ndarray:
    """A tensor's values as a float64 numpy array."""
    return x.detach().to(torch.float64).numpy()


def _visible(sq: int, sk: int, window, causal: bool) -> torch.Tensor:
    """(Sq, Sk) bool: key j visible to query i, bottom-right aligned."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    ok = torch.ones((sq, sk), dtype=torch.bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def attention_torch(q, k, v, *, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0,
                    alibi=None, sinks=None, keep: Optional[torch.Tensor] = None,
                    dropout_p: float = 0.0, return_lse: bool = False):
    """Dense attention. q (B,Sq,Hq,D), k (B,Sk,Hk,D), v (B,Sk,Hk,Dv); sinks (Hq,); alibi (Hq,) or
    (B,Hq); keep (B,Hq,Sq,Sk) bool, the dropout keep mask (kept probabilities scaled by
    1/(1-dropout_p)). Returns out (B,Sq,Hq,Dv) in the inputs' dtype; differentiable in q, k, v and
    sinks. Fully masked rows give out = 0 with zero gradients. With ``return_lse`` also returns
    lse (B,Hq,Sq): -inf for a fully masked row without sinks."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        slopes = alibi.to(s.dtype).reshape(-1, hq)[:, :, None, None]
        dist = (torch.arange(sq)[:, None] + sk - sq - torch.arange(sk)[None, :]).abs().to(s.dtype)
        s = s - slopes * dist
    vis = _visible(sq, sk, window, causal).expand(b, hq, sq, sk)
    if sinks is not None:
        col = sinks.to(s.dtype).reshape(1, hq, 1, 1).expand(b, hq, sq, 1)
        s = torch.cat([s, col], dim=-1)
        vis = torch.cat([vis, torch.ones((b, hq, sq, 1), dtype=torch.bool)], dim=-1)
    live = vis.any(dim=-1, keepdim=True)
    s = torch.where(vis, s, torch.full_like(s, -torch.inf))
    s = torch.where(live, s, torch.zeros_like(s))  # fully masked rows: softmax of zeros, then 0
    p = torch.softmax(s, dim=-1) * live
    lse = torch.where(live, torch.logsumexp(s, dim=-1, keepdim=True), -torch.inf)[..., 0]
    p = p[..., :sk]
    if keep is not None:
        p = p * keep.to(p.dtype) / (1.0 - dropout_p)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return (out, lse) if return_lse else out


def _seq_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (..., M, K) @ b (..., K, N) accumulated over K sequentially in float32."""
    acc = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.float32)
    for t in range(a.shape[-1]):
        acc = acc + a[..., :, t:t + 1] * b[..., t:t + 1, :]
    return acc


def _seq_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension, sequentially in float32; keeps the dimension."""
    acc = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float32)
    for t in range(x.shape[-1]):
        acc = acc + x[..., t:t + 1]
    return acc


def naive_gradients(q, k, v, dout, *, dtype, softmax_scale=None, causal=False, window=(-1, -1),
                    softcap=0.0, alibi=None, sinks=None, keep=None, dropout_p=0.0):
    """(dq, dk, dv, dsinks or None) of <out, dout> by the naive same-dtype computation.

    Inputs hold values representable in ``dtype`` (a torch dtype); results are float32 tensors
    holding ``dtype`` values (dsinks is accumulated in float64, as in the C++ suite).
    """
    def rd(x):
        return x.to(dtype).float()

    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = hq // hk
    qh, kh, vh, doh = (x.float().transpose(1, 2) for x in (
        q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2), dout))
    scale = (1.0 / torch.sqrt(torch.tensor(float(d), dtype=torch.float32)) if softmax_scale is None
             else torch.tensor(softmax_scale, dtype=torch.float32))
    x = rd(rd(_seq_mm(qh, kh.transpose(-1, -2))) * scale)
    if softcap > 0:
        cap = torch.tensor(softcap, dtype=torch.float32)
        t = torch.tanh(x / cap)
        x = rd(cap * t)
    if alibi is not None:
        slopes = alibi.float().reshape(-1, hq)[:, :, None, None]
        dist = (torch.arange(sq)[:, None] + sk - sq - torch.arange(sk)[None, :]).abs().float()
        x = rd(x - slopes * dist)
    vis = _visible(sq, sk, window, causal).expand(b, hq, sq, sk)
    sink = (torch.full((hq,), -torch.inf) if sinks is None else sinks.float())[None, :, None, None]
    row_max = torch.maximum(torch.where(vis, x, -torch.inf).amax(-1, keepdim=True), sink)
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.where(vis, torch.exp(x - safe_max), torch.zeros_like(x))
    total = _seq_sum(torch.cat([torch.exp(sink - safe_max).expand(b, hq, sq, 1), e], -1))
    live = vis.any(-1, keepdim=True)
    p = torch.where(vis & live, rd(e / torch.where(live, total, torch.ones_like(total))),
                    torch.zeros_like(e))
    z = torch.ones_like(p)
    if keep is not None:
        keep_scale = 1.0 / torch.tensor(1.0 - dropout_p, dtype=torch.float32)
        z = torch.where(keep, keep_scale, torch.zeros_like(p))
    kept = rd(p * z)
    dp = torch.where(vis, rd(rd(_seq_mm(doh, vh.transpose(-1, -2))) * z), torch.zeros_like(p))
    delta = _seq_sum(p * dp)
    dsc = rd(p * (dp - delta))
    if softcap > 0:
        dsc = rd(dsc * (1.0 - t * t))
    ds = torch.where(vis, rd(dsc * scale), torch.zeros_like(p))
    dq = rd(_seq_mm(ds, kh)).transpose(1, 2)
    dk_h = rd(_seq_mm(ds.transpose(-1, -2), qh)).transpose(1, 2)
    dv_h = rd(_seq_mm(kept.transpose(-1, -2), doh)).transpose(1, 2)
    dk = rd(dk_h.reshape(b, sk, hk, group, d).sum(3))
    dv = rd(dv_h.reshape(b, sk, hk, group, -1).sum(3))
    dsinks = None
    if sinks is not None:
        lse = safe_max + torch.log(total)
        p_sink = torch.exp(sink.double() - lse.double())
        dsinks = -(p_sink * delta.double() * live).sum(dim=(0, 2, 3))
    return dq, dk, dv, dsinks


def leaf(x: torch.Tensor, dtype) -> torch.Tensor:
    """A detached copy of ``x`` in ``dtype`` that requires grad."""
    return x.detach().to(dtype).requires_grad_(True)


def gradients(fn, inputs: Sequence[torch.Tensor], dout: torch.Tensor):
    """Gradients of <fn(*inputs), dout> with respect to each input that requires grad."""
    out = fn(*inputs)
    wrt = [x for x in inputs if x is not None and x.requires_grad]
    return out, torch.autograd.grad(out, wrt, dout.to(out.dtype))


def grads_2x(got: Dict[str, torch.Tensor], ref64: Dict[str, torch.Tensor],
             naive: Dict[str, torch.Tensor], dtype: str) -> None:
    """flash-attn's 2x rule on each named gradient; eps is one ulp of ``dtype`` at the largest
    |reference| (f32 for dsinks, which anyattn returns in float32)."""
    for name, g in got.items():
        r = ref64[name].double().numpy()
        eps_dtype = "float32" if name == "dsinks" else dtype
        check_2x(name, g.double().numpy(), r, naive[name].double().numpy(),
                 out_eps(eps_dtype, r))
        assert np.isfinite(g.double().numpy()).all(), name
