"""transformers integration: ``attn_implementation="anyattn"``.

    import anyattn.integrations.transformers as anyattn_hf
    anyattn_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="anyattn")

``register()`` adds ``anyattention_forward`` to transformers' ``AttentionInterface`` and
``anyattn_mask`` (transformers_masks.py) to its ``AttentionMaskInterface``. The attention function
takes the calls transformers makes to flash-attention and answers them the same way:

* a 2-D padding mask: the batch is unpadded once and run as one varlen call, then padded back;
* ``cu_seq_lens_q/k`` with ``max_length_q/k`` (padding-free collators, vision towers): one varlen
  call over the flattened tokens;
* packed ``position_ids`` (one row whose positions restart, as ``DataCollatorWithFlattening``
  produces), detected by transformers' own rule: one varlen call;
* otherwise one dense call.

With an 8-bit ``KV8Cache`` (transformers_kv8.py) as ``past_key_values``, the key it receives is
the cache itself, tagged by the cache layer's update: one ``flash_attn_with_kvcache`` call
appends the new states and attends over it.

A 4-D mask (a pattern varlen cannot express, or a model that builds its own) is computed exactly by
``masked_attention``, which materialises the score matrix and warns once per process.

The detection mirrors transformers' ``_flash_attention_forward`` rather than calling it: that
function resolves its kernels through ``lazy_import_flash_attention``, one process-wide slot that
only loads flash-attention packages or hub kernels, and it forwards sinks only under the names
``s_aux`` / ``learnable_sink`` (anyattn's is ``sinks``), so gpt-oss would lose them.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .transformers_masks import anyattn_mask, masked_attention
from .transformers_varlen import (
    cu_seqlens_from_position_ids,
    is_packed_sequence,
    packed_attention,
    padded_attention,
)

NAME = "anyattn"
# The same functions under a name transformers recognises as a flash-attention implementation
# (see register).
FLASH_NAME = "anyattn_flash"

_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _window(sliding_window: Optional[int]) -> Tuple[int, int]:
    # transformers' sliding window of w tokens: key j visible iff q - w < j (and causal), i.e.
    # a left window of w - 1, matching what it passes to flash-attention.
    if sliding_window is None:
        return (-1, -1)
    return (int(sliding_window) - 1, int(sliding_window) - 1)


def _longest(cu_seqlens: torch.Tensor) -> int:
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())


def _options(module, dropout, scaling, sliding_window, softcap, is_causal, s_aux) -> dict:
    """The flash-attn keyword arguments of one transformers attention call."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return dict(
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=bool(causal),
        window_size=_window(sliding_window),
        softcap=float(softcap) if softcap is not None else 0.0,
        sinks=s_aux,
    )


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

    Returns (attn_output (B, Sq, Hq, Dv), None). ``attention_mask`` is None, the 2-D padding mask
    (True / 1 = real token) or a 4-D boolean / additive mask. Honours ``scaling``, ``dropout``,
    ``sliding_window``, ``softcap``, ``is_causal`` (default: ``module.is_causal``) and ``s_aux``
    (gpt-oss sinks); reads ``position_ids`` and ``cu_seq_lens_q/k``, ``max_length_q/k`` from
    kwargs (the maxima are derived from the boundaries when absent). Paged calls
    (``block_table``) raise ValueError. A key from a KV8Cache layer goes to kv8_attention.
    """
    if kwargs.get("block_table") is not None:
        raise ValueError("block_table: paged (continuous-batching) calls are not supported by "
                         "attn_implementation='anyattn'; use generate() or the model's forward")
    pending = getattr(key, "anyattn_kv8", None)  # the layer's update of a KV8Cache
    if pending is not None:
        from .transformers_kv8 import kv8_attention  # noqa: PLC0415 - imports transformers

        return kv8_attention(pending, query, attention_mask, _options(
            module, dropout, scaling, sliding_window, softcap, is_causal, s_aux)), None
    if attention_mask is not None and attention_mask.dim() != 2:
        out = masked_attention(query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               softcap=softcap, s_aux=s_aux)
        return out, None

    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    options = _options(module, dropout, scaling, sliding_window, softcap, is_causal, s_aux)
    if attention_mask is not None:
        return padded_attention(q, k, v, attention_mask, **options), None

    cu_q, cu_k, max_q, max_k = (kwargs.get(name) for name in _VARLEN_KWARGS)
    if cu_q is not None and cu_k is not None:
        # transformers' flash path needs all four; a missing maximum (vision towers leave it None
        # when the implementation name is not a flash one) is read off the boundaries instead.
        max_q = max_q if max_q is not None else _longest(cu_q)
        max_k = max_k if max_k is not None else _longest(cu_k)
        return packed_attention(q, k, v, cu_q, cu_k, max_q, max_k, **options), None

    position_ids = kwargs.get("position_ids")
    if is_packed_sequence(position_ids, q.shape[0]):
        if q.shape[1] != k.shape[1]:
            raise ValueError(
                "position_ids: packed sequences (positions restarting within one row) need as "
                f"many keys as queries, got {q.shape[1]} queries and {k.shape[1]} keys "
                "(a cache with packed sequences is not supported)"
            )
        cu_seqlens, max_seqlen = cu_seqlens_from_position_ids(position_ids)
        out = packed_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **options)
        return out, None

    return flash_attn_func(q, k, v, **options), None


def register(name: str = NAME, flash_name: str = FLASH_NAME) -> None:
    """Register anyattn with transformers under ``name`` and ``flash_name`` (attention and mask
    interfaces).

    After this, ``from_pretrained(..., attn_implementation=name)`` and
    ``from_config(config, attn_implementation=name)`` use anyattn. ``flash_name`` (it must contain
    "flash") selects the same functions, and transformers then also treats anyattn as one of its
    flash-attention implementations: models take their flash-only branches (a Qwen2-VL /
    Qwen2.5-VL vision tower passes its cu_seqlens instead of looping over the images), and
    transformers' own flash utilities load anyattn's flash-attn functions under that name.
    Requires transformers >= 4.56 (AttentionInterface and AttentionMaskInterface); tested with
    the version scripts/setup.sh pins.
    """
    from transformers import AttentionInterface  # noqa: PLC0415 - optional dependency
    from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415

    if "flash" not in flash_name:
        raise ValueError(f"flash_name: must contain 'flash' (transformers' test for a flash "
                         f"implementation), got {flash_name!r}")
    for each in (name, flash_name):
        AttentionInterface.register(each, anyattention_forward)
        AttentionMaskInterface.register(each, anyattn_mask)
    _serve_flash_imports(flash_name)


def _serve_flash_imports(flash_name: str) -> None:
    """Let transformers load anyattn's flash-attn functions for ``flash_name``.

    A model that selects a name containing "flash" makes transformers load that implementation's
    functions into one process-wide slot (``lazy_import_flash_attention``), and its loader
    (``_lazy_imports``) knows only flash-attn packages and hub kernels, so it would refuse the
    name. The loader is wrapped, once per process, to answer anyattn's flash names with
    flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache; every other name goes to
    transformers' own loader.
    """
    from transformers import modeling_flash_attention_utils as fa_utils  # noqa: PLC0415

    loader = fa_utils._lazy_imports
    names = getattr(loader, "anyattn_flash_names", None)
    if names is None:
        names = set()
        transformers_loader = loader

        def lazy_imports(implementation, *args, **kwargs):
            if implementation in names:
                return (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                        fa_utils._pad_input, fa_utils._unpad_input)
            return transformers_loader(implementation, *args, **kwargs)

        lazy_imports.anyattn_flash_names = names
        fa_utils._lazy_imports = lazy_imports
    names.add(flash_name)
