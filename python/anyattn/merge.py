"""Merging two partial attentions of the same queries over disjoint key sets by their LSEs
(split-K decoding, ring attention, prefix caching): ``merge_attention_states`` and its in-place
form. numpy arrays and CPU torch tensors run anyattn's C kernel; other devices run in torch.
"""

from __future__ import annotations

from ._arguments import _kind
from ._cache import merge_states
from ._tensors import torch_module


def _check_merge(out_a, lse_a, out_b, lse_b) -> str:
    kind = _kind(out_a, "out_a")
    for name, x in (("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if _kind(x, name) != kind:
            raise TypeError(f"{name}: must be a {kind} array/tensor like out_a")
    return kind


def _merge_on_device(out_a, lse_a, out_b, lse_b):
    torch = torch_module()
    # lse (.., H, T) -> (.., T, H, 1) to weight out (.., T, H, Dv).
    la, lb = lse_a.float().transpose(-1, -2)[..., None], lse_b.float().transpose(-1, -2)[..., None]
    top = torch.maximum(la, lb)
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
    wa, wb = torch.exp(la - top), torch.exp(lb - top)
    total = wa + wb
    xa = torch.where(wa > 0, wa * out_a.float(), torch.zeros_like(wa))
    xb = torch.where(wb > 0, wb * out_b.float(), torch.zeros_like(wb))
    out = torch.where(total > 0, (xa + xb) / total, torch.zeros_like(total)).to(out_a.dtype)
    lse = (top + torch.log(total))[..., 0].transpose(-1, -2)
    return out, lse


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merge two attentions of the same queries over disjoint key sets.

    out_a, out_b: (T, H, Dv) with lse (H, T), or (B, S, H, Dv) with lse (B, H, S); lse float32,
    natural log; -inf marks an empty partial result (weight 0, even if its out row holds NaN).
    Returns (out, lse) with out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b) and
    lse = log(e^lse_a + e^lse_b); both empty gives out = 0, lse = -inf.
    """
    kind = _check_merge(out_a, lse_a, out_b, lse_b)
    if kind == "numpy":
        return merge_states(out_a, lse_a, out_b, lse_b)
    if out_a.device.type != "cpu":
        return _merge_on_device(out_a, lse_a, out_b, lse_b)
    return torch_module().ops.anyattn.merge_attention_states(out_a, lse_a, out_b, lse_b)


def merge_attention_states_(out_a, lse_a, out_b, lse_b):
    """In-place merge_attention_states: writes the merged out into out_a and lse into lse_a.

    Returns (out_a, lse_a).
    """
    kind = _check_merge(out_a, lse_a, out_b, lse_b)
    if kind == "numpy":
        merge_states(out_a, lse_a, out_b, lse_b, out=out_a, lse_out=lse_a)
    elif out_a.device.type != "cpu":
        out, lse = _merge_on_device(out_a, lse_a, out_b, lse_b)
        out_a.copy_(out)
        lse_a.copy_(lse)
    else:
        torch_module().ops.anyattn.merge_attention_states_(out_a, lse_a, out_b, lse_b)
    return out_a, lse_a
