"""Test oracle: the attention contract (docs/semantics.md) in plain numpy.

``attention_ref(..., dtype=None)`` computes in float64: the reference. With ``dtype`` set to
"float32", "float16" or "bfloat16" it is the naive same-dtype computation that flash-attn's test
rule compares against, defined exactly as the C++ suite's (tests/common/test_support.cc,
``naive_same_dtype``): each matmul accumulates sequentially in float32 and rounds its result to
``dtype``; scale, softcap and ALiBi are each rounded to ``dtype``; the softmax runs in float32 and
its probabilities are rounded to ``dtype``. ``check_2x`` applies flash-attn's acceptance rule with
the C++ suite's eps.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def round_to(x: np.ndarray, dtype: Optional[str]) -> np.ndarray:
    """Round float values to ``dtype`` (None = keep float64) and return them as float32/float64."""
    if dtype is None:
        return np.asarray(x, np.float64)
    x32 = np.asarray(x, np.float32)
    if dtype == "float32":
        return x32
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x32.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x32), x32, out)
    raise ValueError(dtype)


def _matmul(a: np.ndarray, b: np.ndarray, naive: bool) -> np.ndarray:
    """a (..., M, K) @ b (..., K, N): float64 BLAS for the reference, or for the naive computation a
    sequential float32 accumulation over K (one rounding per product and per add)."""
    if not naive:
        return a @ b
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)
    for t in range(a.shape[-1]):
        acc += a[..., :, t:t + 1] * b[..., t:t + 1, :]
    return acc


def visible(sq: int, sk: int, window: Tuple[int, int], causal: bool) -> np.ndarray:
    """(Sq, Sk) bool: key j visible to query i, bottom-right aligned."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    ok = np.ones((sq, sk), bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def attention_ref(q, k, v, *, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0,
                  alibi=None, sinks=None, dtype: Optional[str] = None):
    """Dense attention per the contract. q (B,Sq,Hq,D), k (B,Sk,Hk,D), v (B,Sk,Hk,Dv) as float arrays.

    Returns (out (B,Sq,Hq,Dv), lse (B,Hq,Sq)); float64 when ``dtype`` is None, else rounded as
    described in the module docstring (out in ``dtype``'s values, lse float32).
    """
    work = np.float64 if dtype is None else np.float32
    q, k, v = (round_to(x, dtype).astype(work) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    groups = hq // hk
    k = np.repeat(k, groups, axis=2)
    v = np.repeat(v, groups, axis=2)
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # (B, H, S, D)
    naive = dtype is not None
    s = round_to(_matmul(qh, kh.transpose(0, 1, 3, 2), naive), dtype).astype(work)
    s = round_to(s * work(scale), dtype).astype(work)
    if softcap > 0:
        s = round_to(work(softcap) * np.tanh(s / work(softcap)), dtype).astype(work)
    if alibi is not None:
        slopes = np.asarray(alibi, np.float64).reshape(-1 if np.ndim(alibi) == 1 else b, hq)
        slopes = slopes if slopes.shape[0] == b else np.broadcast_to(slopes, (b, hq))
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        dist = np.abs(i + sk - sq - j).astype(np.float64)
        bias = -slopes[:, :, None, None] * dist
        s = round_to(s + bias.astype(work), dtype).astype(work)
    s = np.where(visible(sq, sk, window, causal), s, -np.inf)
    if sinks is not None:
        col = np.broadcast_to(np.asarray(sinks, work).reshape(1, hq, 1, 1), (b, hq, sq, 1))
        s = np.concatenate([s, col], axis=-1)
    s = s.astype(np.float64 if dtype is None else np.float32)
    m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    if naive:  # sequential float32 sum, as the C++ naive does
        denom = np.zeros(e.shape[:-1] + (1,), np.float32)
        for t in range(e.shape[-1]):
            denom += e[..., t:t + 1]
    else:
        denom = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = (np.log(denom) + m_safe)[..., 0]
        p = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
    p = round_to(p[..., :sk], dtype).astype(work)
    out = round_to(_matmul(p, vh, naive), dtype).transpose(0, 2, 1, 3)
    return out, lse.astype(np.float64 if dtype is None else np.float32)


def max_err(a, b) -> float:
    """max |a - b| over finite-or-equal entries; NaN anywhere counts as infinite error."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.size == 0:
        return 0.0
    same = a == b
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


_MACHINE_EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _max_abs_finite(x) -> float:
    x = np.asarray(x, np.float64)
    finite = x[np.isfinite(x)]
    return float(np.abs(finite).max()) if finite.size else 0.0


def out_eps(dtype: str, ref_out) -> float:
    """eps of the 2x rule for out, as in the C++ suite (tests/common/test_support.cc): one ulp of the
    dtype at the largest |reference output|, the final rounding the kernel does differently."""
    return _MACHINE_EPS[dtype] * _max_abs_finite(ref_out)


def lse_eps(ref_lse) -> float:
    """eps of the 2x rule for the f32 LSE, as in the C++ suite: four f32 ulps of max(1, max|lse|)."""
    return 4.0 * 2.0 ** -23 * max(1.0, _max_abs_finite(ref_lse))


def check_2x(name: str, got, ref64, naive, eps: float) -> None:
    """flash-attn's rule: max|got - ref64| <= 2 * max|naive - ref64| + eps, with a useful message."""
    err = max_err(got, ref64)
    bound = 2 * max_err(naive, ref64) + eps
    if not err <= bound:
        got64 = np.asarray(got, np.float64)
        ref = np.asarray(ref64, np.float64)
        diff = np.abs(got64 - ref)
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise AssertionError(
            f"{name}: max error {err:.3g} > bound {bound:.3g} at index {worst}: "
            f"got {got64[worst]!r}, reference {ref[worst]!r}"
        )
