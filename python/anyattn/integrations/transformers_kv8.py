"""An 8-bit KV cache for transformers' ``generate``, run by anyattn's cache call.

    import anyattn.integrations.transformers as anyattn_hf
    anyattn_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="anyattn")
    cache = anyattn_hf.KV8Cache(torch.float8_e4m3fn)       # or torch.float8_e5m2, torch.int8
    model.generate(ids, cache=cache, max_new_tokens=...)  # past_key_values= before 5.x

``KV8Cache`` is a transformers ``Cache`` whose layers (``KV8Layer``) keep keys and values in
anyattn's cache layout (batch, capacity, kv_heads, head_dim) in the 8-bit dtype, with one float32
scale per (position, kv head) (``k_token_scale``/``v_token_scale``, see anyattn.kv_quant). The
layer does not quantize anything itself: its ``update`` records the new key/value states and
returns the 8-bit caches (as (batch, kv_heads, capacity, head_dim) views) tagged with that pending
append; anyattn's attention function (``attn_implementation="anyattn"``) then makes one
``flash_attn_with_kvcache`` call that appends the new states, quantized by the C library, and
attends over the whole cache. Any other attention implementation receives 8-bit tensors it cannot
use and fails; a second update of a layer whose append never ran raises RuntimeError.

Left-padded batches (generate's 2-D attention mask) run with ``cache_leftpad`` (a padded prompt
as an append, then a read-only call, since the padding must already be in the cache); other
masks (4-D, padding in the middle) raise NotImplementedError. Sliding windows, softcap and sinks are passed
to the call. Tested on CPU tensors; off the CPU the cache call runs its device route, which
reads the cache dequantized (docs/python.md, "Device dispatch").
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..kv_quant import check_cache_dtype


class PendingAppend(NamedTuple):
    """A layer's update waiting for the attention call: the layer and its new states
    (batch, kv_heads, new_len, head_dim)."""

    layer: "KV8Layer"
    keys: torch.Tensor
    values: torch.Tensor


class KV8Layer(CacheLayerMixin):
    """One layer's 8-bit cache: k8/v8 (batch, capacity, kv_heads, head_dim) of ``cache_dtype``,
    k_scale/v_scale float32 (batch, capacity, kv_heads), the first ``length`` positions in use.
    The capacity starts at ``initial_capacity`` (or the first update's length) and doubles when
    an update does not fit."""

    is_compileable = False
    is_sliding = False
    is_croppable = True

    def __init__(self, cache_dtype, initial_capacity: int = 256, **kwargs):
        super().__init__()
        check_cache_dtype(cache_dtype, "cache_dtype")
        self.cache_dtype = cache_dtype
        self.initial_capacity = int(initial_capacity)
        self.length = 0
        self.pending: Optional[PendingAppend] = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, hk, s, d = key_states.shape
        self.device = key_states.device
        self.batch_size = b
        capacity = max(self.initial_capacity, s)
        self.k8 = torch.zeros((b, capacity, hk, d), dtype=self.cache_dtype, device=self.device)
        self.v8 = torch.zeros((b, capacity, hk, value_states.shape[-1]), dtype=self.cache_dtype,
                              device=self.device)
        self.k_scale = torch.zeros((b, capacity, hk), dtype=torch.float32, device=self.device)
        self.v_scale = torch.zeros_like(self.k_scale)
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        """Grow the storage (doubling) to hold ``needed`` positions, keeping the used ones."""
        capacity = self.k8.shape[1]
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2

        def grown(t):
            out = t.new_zeros((t.shape[0], capacity) + tuple(t.shape[2:]))
            out[:, : self.length] = t[:, : self.length]
            return out

        self.k8, self.v8 = grown(self.k8), grown(self.v8)
        self.k_scale, self.v_scale = grown(self.k_scale), grown(self.v_scale)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Record the new states (batch, kv_heads, new_len, head_dim) for the attention call and
        return the 8-bit caches as (batch, kv_heads, capacity, head_dim) views tagged with the
        pending append (attribute ``anyattn_kv8``)."""
        if self.pending is not None:
            raise RuntimeError(
                "KV8Cache: the previous update of this layer was never appended: the attention "
                "call did not go through anyattn. Load the model with "
                "attn_implementation='anyattn' (after anyattn.integrations.transformers."
                "register())")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._reserve(self.length + key_states.shape[-2])
        self.pending = PendingAppend(self, key_states, value_states)
        keys, values = self.k8.transpose(1, 2), self.v8.transpose(1, 2)
        keys.anyattn_kv8 = self.pending
        return keys, values

    def appended(self) -> None:
        """Called by the attention call once the pending states are in the cache."""
        self.length += self.pending.keys.shape[-2]
        self.pending = None

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.pending = None
        if self.is_initialized:
            self.k8.zero_()
            self.v8.zero_()
            self.k_scale.zero_()
            self.v_scale.zero_()

    def _select(self, index: torch.Tensor) -> None:
        index = index.to(self.device)
        self.k8, self.v8 = self.k8.index_select(0, index), self.v8.index_select(0, index)
        self.k_scale = self.k_scale.index_select(0, index)
        self.v_scale = self.v_scale.index_select(0, index)
        self.batch_size = self.k8.shape[0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self._select(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._select(torch.arange(self.k8.shape[0]).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._select(torch.as_tensor(indices))

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``tokens_to_remove`` positions (a negative value keeps that many fewer
        than the current length, as DynamicLayer.crop)."""
        keep = self.length - tokens_to_remove if tokens_to_remove >= 0 else -tokens_to_remove
        if 0 <= keep < self.length:
            self.length = keep


class KV8Cache(Cache):
    """A transformers Cache of ``KV8Layer``s (one per model layer, created as the model first
    updates them): pass it to ``generate(cache=...)`` (``past_key_values=``, deprecated in
    transformers 5) or a forward, with the model loaded with ``attn_implementation="anyattn"``.

    Arguments:
        cache_dtype: torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8.
        initial_capacity: positions allocated per layer before the storage first doubles.
    """

    def __init__(self, cache_dtype, initial_capacity: int = 256):
        check_cache_dtype(cache_dtype, "cache_dtype")
        self.cache_dtype = cache_dtype

        def layer():
            return KV8Layer(cache_dtype, initial_capacity)

        super().__init__(layer_class_to_replicate=layer)


def _left_padding(attention_mask: Optional[torch.Tensor], batch: int):
    """cache_leftpad (batch,) int32 of a 2-D left-padding mask (None without padding)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise NotImplementedError(
            f"attention_mask: a {attention_mask.dim()}-D mask cannot be expressed on an 8-bit "
            "KV8Cache (supported: none, or generate's 2-D left-padding mask)")
    mask = attention_mask.to(torch.bool)
    pad = (~mask).to(torch.int32).cumprod(dim=-1).sum(dim=-1)
    positions = torch.arange(mask.shape[-1], device=mask.device)[None, :]
    if bool((mask != (positions >= pad[:, None])).any()):
        raise NotImplementedError(
            "attention_mask: only left padding (zeros before the first token of each row) is "
            "supported with an 8-bit KV8Cache")
    return pad.to(torch.int32) if bool(pad.any()) else None


def kv8_attention(pending: PendingAppend, query: torch.Tensor, attention_mask, options: dict):
    """The attention call of a KV8Cache layer: appends the pending states and attends over the
    cache in one flash_attn_with_kvcache call. query (B, Hq, Sq, D); returns (B, Sq, Hq, Dv)."""
    from ..kvcache import flash_attn_with_kvcache  # noqa: PLC0415

    layer = pending.layer
    if options.get("dropout_p", 0.0) > 0.0:
        raise NotImplementedError("dropout: an 8-bit KV8Cache is an inference path; use "
                                  "model.eval()")
    batch, hq, _, d = query.shape
    seqlens = torch.full((batch,), layer.length, dtype=torch.int32)
    pad = _left_padding(attention_mask, batch)
    scales = dict(k_token_scale=layer.k_scale, v_token_scale=layer.v_scale)
    score = dict(softmax_scale=options["softmax_scale"], causal=options["causal"],
                 window_size=options["window_size"], softcap=options["softcap"],
                 sinks=options["sinks"])
    k_new, v_new = pending.keys.transpose(1, 2), pending.values.transpose(1, 2)
    q = query.transpose(1, 2)
    if pad is not None and int(pad.max()) > layer.length:
        # A padded prompt: cache_leftpad may not exceed the keys stored before the call, so the
        # prompt is appended first (the attention of that call's one zero query is discarded)
        # and then attended to with the cache only read.
        flash_attn_with_kvcache(q.new_zeros((batch, 1, hq, d)), layer.k8, layer.v8, k_new, v_new,
                                cache_seqlens=seqlens, **scales)
        out = flash_attn_with_kvcache(q, layer.k8, layer.v8, cache_seqlens=seqlens + q.shape[1],
                                      cache_leftpad=pad, **score, **scales)
    else:
        out = flash_attn_with_kvcache(q, layer.k8, layer.v8, k_new, v_new, cache_seqlens=seqlens,
                                      cache_leftpad=pad, **score, **scales)
    layer.appended()
    return out
