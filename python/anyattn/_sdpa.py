"""The portable fallback for torch tensors on devices anyattn has no kernels for (and CUDA without
flash_attn): torch's ``scaled_dot_product_attention`` with a mask equivalent to the contract, or a
plain f32 computation where SDPA cannot express the call.

Equivalences used (the contract is docs/semantics.md):
- Mask: bottom-right aligned. Key j is visible to query i iff
  ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, with causal meaning right = 0. Passed to SDPA
  as a boolean mask (SDPA's own ``is_causal`` is top-left aligned, so it is never used).
- Sinks: one extra key column whose score is the sink logit and whose value is zero; it joins the
  softmax denominator and contributes nothing to the output.
- ALiBi: an additive bias ``-slope_h * |i + Sk - Sq - j|``.
- Fully masked rows: SDPA yields NaN there; they are set to 0 (LSE -inf), as the contract says.

SDPA takes the bias in the query's dtype, which would round ALiBi and sink logits in f16/bf16, and
it has no softcap and returns no LSE. Those calls use ``math_attention`` (scores in f32, chunked
over queries so that memory stays bounded by ``chunk x Sk`` per head).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from ._options import AttnOptions

_QUERY_CHUNK = 1024


def visible_mask(sq: int, sk: int, window: Tuple[int, int], device) -> torch.Tensor:
    """Boolean (Sq, Sk) mask, True where key j is visible to query i (bottom-right aligned)."""
    left, right = window
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    diag = i + (sk - sq)
    mask = torch.ones((sq, sk), dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    return mask


def has_empty_rows(sq: int, sk: int, window: Tuple[int, int]) -> bool:
    """True if some query sees no key, decided on the host (no device sync).

    Query i's visible keys are [i + Sk - Sq - left, i + Sk - Sq + right] clipped to [0, Sk); with
    left, right >= 0 that interval is never empty before clipping, and query i's upper end is below
    0 exactly when i < Sq - Sk - right. The lower end never exceeds Sk - 1.
    """
    right = window[1]
    return sq > 0 and (sk == 0 or (right >= 0 and sq - sk - right > 0))


def alibi_bias(alibi_slopes: torch.Tensor, b: int, sq: int, sk: int) -> torch.Tensor:
    """f32 bias of shape (B or 1, Hq, Sq, Sk): ``-slope * |i + Sk - Sq - j|``."""
    i = torch.arange(sq, device=alibi_slopes.device).unsqueeze(1)
    j = torch.arange(sk, device=alibi_slopes.device).unsqueeze(0)
    dist = (i + (sk - sq) - j).abs().to(torch.float32)
    slopes = alibi_slopes.to(torch.float32)
    slopes = slopes.reshape(1, -1) if slopes.dim() == 1 else slopes
    return -slopes[:, :, None, None] * dist


def needs_math(options: AttnOptions, dtype: torch.dtype, has_alibi: bool, has_sinks: bool,
               return_lse: bool) -> Optional[str]:
    """Why SDPA cannot run this call exactly (so the f32 math path must), or None if it can."""
    if options.softcap > 0.0:
        return "softcap is not expressible as an SDPA mask"
    if return_lse:
        return "SDPA does not return the log-sum-exp"
    if (has_alibi or has_sinks) and dtype != torch.float32:
        return "SDPA would round the ALiBi/sink bias to the query dtype"
    return None


def _heads_first(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, S, H, D) -> (B, H*groups, S, D), repeating each kv head for its query-head group."""
    x = x.transpose(1, 2)
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def sdpa_attention(q, k, v, options: AttnOptions, alibi_slopes, sinks) -> torch.Tensor:
    """Attention through torch SDPA with an equivalent mask. Inputs (B, S, H, D); returns (B, Sq, Hq, Dv).

    Precondition: ``needs_math`` returned None for this call.
    """
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    groups = hq // hk
    qt, kt, vt = q.transpose(1, 2), _heads_first(k, groups), _heads_first(v, groups)
    allowed = visible_mask(sq, sk, options.effective_window(), q.device)
    if alibi_slopes is None and sinks is None:
        mask = allowed
    else:
        mask = torch.zeros((1, 1, sq, sk), dtype=torch.float32, device=q.device)
        if alibi_slopes is not None:
            mask = mask + alibi_bias(alibi_slopes, b, sq, sk)
        mask = mask.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            sink_col = sinks.to(torch.float32).reshape(1, hq, 1, 1).expand(mask.shape[0], hq, sq, 1)
            mask = torch.cat([mask.expand(mask.shape[0], hq, sq, sk), sink_col], dim=-1)
            kt = torch.cat([kt, kt.new_zeros(b, hq, 1, d)], dim=2)
            vt = torch.cat([vt, vt.new_zeros(b, hq, 1, vt.shape[-1])], dim=2)
    scale = options.softmax_scale if options.softmax_scale is not None else d ** -0.5
    out = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=mask, dropout_p=options.dropout_p, scale=scale
    )
    out = out.transpose(1, 2)
    if sinks is None and has_empty_rows(sq, sk, options.effective_window()):
        out = out.masked_fill(~allowed.any(dim=1)[None, :, None, None], 0.0)
    return out.contiguous()


def sdpa_with_mask(q, k, v, options: AttnOptions, allowed: torch.Tensor) -> torch.Tensor:
    """SDPA on (B, S, H, D) tensors under a boolean mask broadcastable to (B, Hq, Sq, Sk), True where
    visible. Returns (B, Sq, Hq, Dv); a query that sees no key gets 0 (SDPA would give NaN)."""
    groups = q.shape[2] // k.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), _heads_first(k, groups), _heads_first(v, groups), attn_mask=allowed,
        dropout_p=options.dropout_p, scale=options.softmax_scale)
    sees_nothing = ~allowed.any(dim=-1)  # (B or 1, 1 or Hq, Sq)
    out = out.masked_fill(sees_nothing[..., None], 0.0)
    return out.transpose(1, 2).contiguous()


def math_attention(q, k, v, options: AttnOptions, alibi_slopes, sinks
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The contract computed plainly in f32 on q's device. Returns (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)).

    Scores for at most ``_QUERY_CHUNK`` queries exist at a time. Dropout, if requested, is applied to
    the probabilities (``torch.nn.functional.dropout``), as SDPA does.
    """
    b, sq = q.shape[0], q.shape[1]
    sk = k.shape[1]
    allowed = visible_mask(sq, sk, options.effective_window(), q.device)
    bias = alibi_bias(alibi_slopes, b, sq, sk) if alibi_slopes is not None else None
    return masked_math_attention(q, k, v, options, sinks, lambda lo, hi: allowed[lo:hi],
                                 None if bias is None else (lambda lo, hi: bias[:, :, lo:hi]))


def masked_math_attention(q, k, v, options: AttnOptions, sinks, visible_rows: Callable,
                          bias_rows: Optional[Callable]) -> Tuple[torch.Tensor, torch.Tensor]:
    """math_attention under any mask: ``visible_rows(lo, hi)`` gives the (hi - lo, Sk) bool mask of
    queries lo..hi-1 (shared by the batch) and ``bias_rows(lo, hi)``, if given, the f32 score bias
    (B or 1, Hq, hi - lo, Sk). Returns (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)); a query that sees no
    key (and no sink) gets out 0 and lse -inf.
    """
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    groups = hq // hk
    scale = options.softmax_scale if options.softmax_scale is not None else d ** -0.5
    qt = q.transpose(1, 2).to(torch.float32)
    kt = _heads_first(k, groups).to(torch.float32)
    vt = _heads_first(v, groups).to(torch.float32)
    sink = sinks.to(torch.float32).reshape(1, hq, 1, 1) if sinks is not None else None
    outs, lses = [], []
    for start in range(0, max(sq, 1), _QUERY_CHUNK):
        stop = min(start + _QUERY_CHUNK, sq)
        s = scale * torch.matmul(qt[:, :, start:stop], kt.transpose(-1, -2))
        if options.softcap > 0.0:
            s = options.softcap * torch.tanh(s / options.softcap)
        if bias_rows is not None:
            s = s + bias_rows(start, stop)
        s = s.masked_fill(~visible_rows(start, stop), float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink.expand(b, hq, stop - start, 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        p = torch.exp(s - lse.masked_fill(torch.isinf(lse) & (lse < 0), 0.0))
        if options.dropout_p > 0.0:
            p = torch.nn.functional.dropout(p, options.dropout_p)
        outs.append(torch.matmul(p[..., :sk], vt))
        lses.append(lse.squeeze(-1))
    out = torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype).contiguous()
    return out, torch.cat(lses, dim=2)
