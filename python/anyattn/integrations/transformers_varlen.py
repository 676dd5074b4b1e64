"""Varlen plumbing for the transformers integration: packed-sequence detection and padded batches.

Every path here ends in ONE ``anyattn.flash_attn_varlen_func`` call over the real tokens of the
whole batch. Tensors use flash-attention's layout: (batch, seqlen, heads, head_dim).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..bert_padding import pad_input, unpad_input
from ..varlen import flash_attn_varlen_func


def is_packed_sequence(position_ids: Optional[torch.Tensor], batch_size: int) -> bool:
    """Whether ``position_ids`` describe several sequences packed into one row.

    The same rule as transformers' flash-attention path: one row of more than one position whose
    ids are not a single run ``start, start + 1, ...`` (``start`` the smallest id; packed
    sequences all restart from it, which is 0 for most models). Batches of more than one row are
    never treated as packed here: when transformers finds packing in them (it looks only when no
    cache is passed) the registered mask function hands the attention an exact 4-D mask instead.
    """
    if position_ids is None or batch_size != 1 or position_ids.dim() != 2:
        return False
    if position_ids.shape[0] != 1 or position_ids.shape[-1] == 1:
        return False
    run = torch.arange(position_ids.shape[-1], device=position_ids.device) + position_ids.min()
    return bool((run - position_ids[0]).abs().sum() != 0)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """(cu_seqlens int32 (n + 1,), max_seqlen) of a packed row: a sequence starts wherever the
    position id equals the row's smallest id."""
    flat = position_ids.reshape(-1)
    starts = (flat == flat.min()).nonzero().view(-1).to(torch.int32)
    total = torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)
    cu_seqlens = torch.cat((starts, total))
    return cu_seqlens, int(cu_seqlens.diff().max().item())


def packed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
    """Attention over sequences packed back to back along the flattened (batch * seqlen) axis.

    q (B, Sq, Hq, D), k/v (B, Sk, Hk, D[v]); cu_seqlens_* index the flattened rows. Returns
    (B, Sq, Hq, Dv).
    """
    batch = q.shape[0]
    cu_q = torch.as_tensor(cu_seqlens_q, device=q.device).to(torch.int32)
    cu_k = torch.as_tensor(cu_seqlens_k, device=k.device).to(torch.int32)
    out = flash_attn_varlen_func(
        q.reshape(-1, *q.shape[-2:]),
        k.reshape(-1, *k.shape[-2:]),
        v.reshape(-1, *v.shape[-2:]),
        cu_q,
        cu_k,
        int(max_seqlen_q),
        int(max_seqlen_k),
        **options,
    )
    return out.view(batch, -1, *out.shape[-2:])


def padded_attention(q, k, v, key_mask: torch.Tensor, **options) -> torch.Tensor:
    """Attention over a left- or right-padded batch, as one varlen call on the real tokens.

    ``key_mask`` (B, L) marks real key positions (True / 1). When the keys are longer than the
    mask (a static cache's unwritten slots) only the first L keys are used. Causal: queries are
    the last Sq positions of the mask (flash-attention's convention; when Sq equals the key length
    the same mask marks them) and padded query rows are zero. Not causal with Sq != L (cross-
    attention): the mask says nothing about the queries, and every query row is computed.
    Output (B, Sq, Hq, Dv).
    """
    batch, sq = q.shape[0], q.shape[1]
    key_mask = key_mask.to(torch.bool)
    if k.shape[1] > key_mask.shape[-1]:
        k, v = k[:, : key_mask.shape[-1]], v[:, : key_mask.shape[-1]]
    if k.shape[1] != key_mask.shape[-1]:
        raise ValueError(
            f"attention_mask: the 2-D padding mask covers {key_mask.shape[-1]} key positions but "
            f"the keys have {k.shape[1]}; the mask must be at least as long as the keys"
        )
    k_unpadded, _, cu_k, max_k, _ = unpad_input(k, key_mask)
    v_unpadded = unpad_input(v, key_mask)[0]
    if options.get("causal") or sq == key_mask.shape[-1]:
        query_mask = key_mask[:, -sq:]
    else:
        query_mask = torch.ones((batch, sq), dtype=torch.bool, device=key_mask.device)
    q_unpadded, indices_q, cu_q, max_q, _ = unpad_input(q, query_mask)
    out = flash_attn_varlen_func(q_unpadded, k_unpadded, v_unpadded, cu_q, cu_k, max_q, max_k,
                                 **options)
    return pad_input(out, indices_q, batch, sq)
