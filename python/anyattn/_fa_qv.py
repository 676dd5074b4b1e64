"""FlashAttention 3's and 4's ``qv``: the value-side query of absorbed multi-head latent attention
(MLA).

With qv (..., nheads, headdim_v) the scores are softmax_scale * (q . k + qv . v) and out is
softmax(scores) v: attention with the query [q | qv] against the keys [k | v] and the values v.
FA3's default scale is then (headdim + headdim_v) ** -0.5, which is anyattn's default for the
widened query (one over the square root of its last dimension).

- flash_attn_func / flash_attn_varlen_func widen q and k with torch.cat, so autograd reaches q,
  qv, k and v (v through both its uses).
- flash_attn_with_kvcache: where v_cache and k_cache are the two column ranges of one row
  [v | k], as DeepSeek's latent caches are laid out (512 latent columns, then 64 rotary ones),
  the row itself is the key and v_cache its column prefix: anyattn's shared latent cache
  (docs/semantics.md section 11), read in place, 8-bit caches included. The query is then
  [qv | q] (in place too where q's columns follow qv's in one tensor, as sglang slices them) and
  new rows [v | k]; a read of such a row and query without new keys runs in one C call
  (_fa_plan.plain_cache_call's qv) before any CachePlan is made. Otherwise (two separate
  caches, or rotary, which rotates the first columns of q and of the new keys) the keys [k | v]
  are gathered into a copy, and an append is copied back into k_cache (v_cache is appended in
  place); 8-bit caches need the shared row there.
- FA4 (fa4_query_and_keys) as FA3, and q may be None (scores qv . v); a paged varlen call reads a
  [v | k] row in place.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ._checks import MAX_HEAD_DIM
from ._kv_scales import is_8bit


def check_qv(q: torch.Tensor, qv: Any, headdim_v: int, values_name: str) -> None:
    """qv must be a tensor of q's dtype and device, shaped like q but for its last dimension,
    headdim_v (the values' head dim, ``values_name``'s), and [q | qv] within the head dim limit."""
    if not isinstance(qv, torch.Tensor):
        raise TypeError(f"qv: expected a tensor or None, got {type(qv).__name__}")
    if qv.dtype != q.dtype or qv.device != q.device:
        raise TypeError(f"qv: dtype {qv.dtype} on {qv.device} differs from q's {q.dtype} on "
                        f"{q.device}")
    want = tuple(q.shape[:-1]) + (headdim_v,)
    if tuple(qv.shape) != want:
        raise ValueError(f"qv: expected shape {want} (q's, with {values_name}'s head dim "
                         f"{headdim_v} last), got {tuple(qv.shape)}")
    width = q.shape[-1] + headdim_v
    if width > MAX_HEAD_DIM:
        raise ValueError(f"qv: headdim + headdim_v = {q.shape[-1]} + {headdim_v} = {width}; the "
                         f"scores' head dim is at most {MAX_HEAD_DIM}")


def widen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          qv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q', k') = ([q | qv], [k | v]): dense or packed attention with qv as plain attention."""
    check_qv(q, qv, v.shape[-1], "v")
    return torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1)


def shared_row(k_cache: torch.Tensor, v_cache: torch.Tensor) -> Optional[torch.Tensor]:
    """The rows [v | k] as one view starting at v_cache, when k_cache's columns follow
    v_cache's in the same rows of one storage (same dtype, device, leading shape and strides,
    unit last stride); else None."""
    if (k_cache.dtype != v_cache.dtype or k_cache.device != v_cache.device
            or k_cache.dim() != v_cache.dim() or k_cache.shape[:-1] != v_cache.shape[:-1]
            or k_cache.stride() != v_cache.stride() or v_cache.stride(-1) != 1
            or k_cache.untyped_storage().data_ptr() != v_cache.untyped_storage().data_ptr()):
        return None
    dv = v_cache.shape[-1]
    if k_cache.data_ptr() != v_cache.data_ptr() + dv * v_cache.element_size():
        return None
    width = dv + k_cache.shape[-1]
    return v_cache.as_strided(tuple(v_cache.shape[:-1]) + (width,), v_cache.stride(),
                              v_cache.storage_offset())


def fa4_query_and_keys(q: Optional[torch.Tensor], k: Optional[torch.Tensor], v: torch.Tensor,
                       qv: torch.Tensor, paged: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """FA4's qv: the query and keys of the plain attention that computes it. FA4 lets q (and then
    k) be None, leaving the scores qv . v (default scale headdim_v ** -0.5, anyattn's for the
    query qv). A paged cache whose k columns follow v's in one row [v | k] is read in place with
    the query [qv | q], as in CachePlan; other inputs are widened with torch.cat."""
    if q is None:
        if qv.shape[-1] != v.shape[-1]:
            raise ValueError(f"qv: head dim {qv.shape[-1]} differs from v's {v.shape[-1]} (with "
                             "q None the scores are qv . v)")
        return qv, v
    if paged:
        row = shared_row(k, v)
        if row is not None:
            check_qv(q, qv, v.shape[-1], "v")
            return row_query(q, qv), row
    return widen(q, k, v, qv)


def row_query(q: torch.Tensor, qv: torch.Tensor) -> torch.Tensor:
    """The query [qv | q] of a row [v | k]: in place where q's columns follow qv's in one tensor
    (sglang slices both from one query of DeepSeek's layout), else a concatenated copy."""
    adjacent = shared_row(q, qv)
    return adjacent if adjacent is not None else torch.cat([qv, q], dim=-1)


class CachePlan:
    """The flash_attn_with_kvcache call that computes a qv call: its q, caches, new keys and
    values and scales (attributes), and finish(), which completes the caller's caches after it."""

    def __init__(self, q, k_cache, v_cache, k, v, qv, rotary_cos, scales) -> None:
        check_qv(q, qv, v_cache.shape[-1], "v_cache")
        if (k is None) != (v is None):
            raise ValueError("k, v: give both new keys and new values, or neither")
        self._k_cache = k_cache
        self._keys_copy = None
        row = shared_row(k_cache, v_cache) if rotary_cos is None else None
        if row is not None:
            self.q = row_query(q, qv)
            self.k_cache, self.v_cache = row, v_cache
            if k is not None:
                new_rows = torch.cat([v, k], dim=-1)
                self.k, self.v = new_rows, new_rows[..., :v.shape[-1]]
            else:
                self.k = self.v = None
            self.scales = _row_scales(*scales)
            return
        if is_8bit(k_cache) or is_8bit(v_cache):
            raise NotImplementedError(
                "qv: with an 8-bit cache, k_cache and v_cache must be the two column ranges of "
                "one row [v | k] (v_cache's columns first, k_cache's right after them, same "
                "strides), read as one shared latent cache; got separate caches"
                + ("" if rotary_cos is None else " (or rotary_cos, which needs the separate "
                   "keys)"))
        if rotary_cos is not None and 2 * rotary_cos.shape[-1] > q.shape[-1]:
            raise ValueError(f"rotary_cos: rotary_dim {2 * rotary_cos.shape[-1]} exceeds q's head "
                             f"dim {q.shape[-1]}; with qv the rotation applies to q and k only")
        self.q = torch.cat([q, qv], dim=-1)
        self._keys_copy = torch.cat([k_cache, v_cache], dim=-1)
        self.k_cache, self.v_cache = self._keys_copy, v_cache
        self.k = None if k is None else torch.cat([k, v], dim=-1)
        self.v = v
        self.scales = scales

    def finish(self) -> None:
        """Copies the appended keys from the gathered copy back into k_cache (the shared row and
        v_cache were written in place)."""
        if self._keys_copy is not None and self.k is not None:
            self._k_cache.copy_(self._keys_copy[..., :self._k_cache.shape[-1]])


def _row_scales(k_descale, v_descale, k_token_scale, v_token_scale):
    """The scales of a shared row [v | k]: one descale and one token scale per row, so the
    caller's K and V scales must agree. Returned as the row's (k_descale, None, k_token_scale,
    None) (V takes K's)."""
    if (k_descale is None) != (v_descale is None) or (
            k_descale is not None and not (k_descale.shape == v_descale.shape
                                           and torch.equal(k_descale, v_descale))):
        raise ValueError("k_descale, v_descale: with qv on one row [v | k], the row is read with "
                         "one descale; give equal k_descale and v_descale, or neither")
    if (k_token_scale is None) != (v_token_scale is None) or (
            k_token_scale is not None and k_token_scale is not v_token_scale):
        raise ValueError("k_token_scale, v_token_scale: with qv on one row [v | k], the row has "
                         "one scale per position; pass the same tensor as both, or neither")
    return k_descale, None, k_token_scale, None
