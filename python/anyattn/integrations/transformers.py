"""transformers integration: ``attn_implementation="anyattn"``.

    import anyattn.integrations.transformers as anyattn_hf
    anyattn_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="anyattn")

``register()`` adds ``anyattention_forward`` to transformers' ``AttentionInterface`` and, for the
mask, reuses transformers' own flash-attention mask builder (which hands the attention function
either None or the 2-D padding mask, never a dense 4-D mask). Padded batches are then run one
sequence at a time over the unpadded tokens, as flash-attention-2 does with its varlen kernel.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..flash_attn_interface import flash_attn_func

NAME = "anyattn"


def _window(sliding_window: Optional[int]) -> Tuple[int, int]:
    # transformers' sliding window of w tokens: key j visible iff q - w < j (and causal), i.e.
    # a left window of w - 1, matching what it passes to flash-attention.
    if sliding_window is None:
        return (-1, -1)
    return (int(sliding_window) - 1, int(sliding_window) - 1)


def _padded_attention(q, k, v, mask, **kwargs):
    """Attention over a right- or left-padded batch given the 2-D key mask (B, Sk), True = real token.

    Queries are the last Sq positions of the keys (flash-attention's convention); when Sq == Sk the
    same mask marks the real queries. Padded query rows are 0 in the output.
    """
    b, sq = q.shape[0], q.shape[1]
    out = q.new_zeros((b, sq, q.shape[2], v.shape[-1]))
    q_mask = mask[:, -sq:]
    for i in range(b):
        keys = mask[i].nonzero().squeeze(1)
        queries = q_mask[i].nonzero().squeeze(1)
        if queries.numel() == 0:
            continue
        qi = q[i, queries].unsqueeze(0)
        ki, vi = k[i, keys].unsqueeze(0), v[i, keys].unsqueeze(0)
        out[i, queries] = flash_attn_func(qi, ki, vi, **kwargs)[0]
    return out


def anyattention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """transformers attention function: query (B, Hq, Sq, D), key/value (B, Hk, Sk, D[v]).

    Returns (attn_output (B, Sq, Hq, Dv), None). ``attention_mask`` is None or the 2-D padding mask
    produced by the registered mask function; a 4-D mask (a model-specific custom mask) raises
    ValueError, since dropping it would change the result. ``s_aux`` (gpt-oss sinks) is honoured.
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask: anyattn takes the 2-D padding mask built by its registered mask "
            f"function, got shape {tuple(attention_mask.shape)}; use attn_implementation='sdpa' "
            "for models that build custom 4-D masks"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    options = dict(
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=bool(causal),
        window_size=_window(sliding_window),
        softcap=float(softcap) if softcap is not None else 0.0,
        sinks=s_aux,
    )
    if attention_mask is None:
        return flash_attn_func(q, k, v, **options), None
    return _padded_attention(q, k, v, attention_mask.to(torch.bool), **options), None


def register(name: str = NAME) -> None:
    """Register anyattn with transformers under ``name`` (attention and mask interfaces).

    After this, ``from_pretrained(..., attn_implementation=name)`` and
    ``from_config(config, attn_implementation=name)`` use anyattn. Requires transformers >= 4.56
    (AttentionInterface and AttentionMaskInterface).
    """
    from transformers import AttentionInterface  # noqa: PLC0415 - optional dependency
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask  # noqa: PLC0415

    AttentionInterface.register(name, anyattention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
