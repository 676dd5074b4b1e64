"""Per-call cost of the flash-attn cache calls at a small decode step, on their plain C calls
(python/src/torch_plain_call.cc) and on the ordinary route (argument handling in Python, and for
the FA3/FA4 packed-query calls the planning of their sequences, _fa_plan.py), timed in
alternation in one process.

One paged decode step of 4 sequences (8 query heads, 2 kv heads, D 64, pages of 16 keys, 5 to
60 keys each), against a float32 cache and against an int8 cache with float32 per-head descales
and per-token scales (bfloat16 q): flash-attn 2.x's batched cache call, FA3's batched cache
call, flash-attn 2.x's paged varlen call (vLLM's style), FA3's cache call with cu_seqlens_q
(sglang's style; with the float cache also with gpt-oss-style sinks, a bfloat16 Parameter;
with the int8 cache also with one descale expanded to (batch, nheads_k), as sglang passes it),
FA4's paged varlen call, and (float cache) flash-attn's own decode step: the new token's key
rotated and appended by flash_attn_with_kvcache. Then absorbed MLA's decode step on a bfloat16
latent row [v | k] (16 query heads, one latent kv head, D 64 + Dv 512, the same lengths and
pages): sglang's FA3 qv call (q and qv column ranges of one tensor, cu_seqlens_q) and FA4's paged
varlen call with qv. The ordinary route is the one a call takes
when the C functions decline it. Prints the medians (of 5 alternating rounds of 100 calls,
after 50 warm-up calls) in microseconds and ordinary / plain:

    .venv/bin/python bench/fa_planning_overhead.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/fa_planning_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

import anyattn
from anyattn import _core, fa3_interface, fa4_interface

_PLAIN = ("fwd_kvcache_torch_plain", "fwd_kvcache_varlen_torch_plain")
_PLAIN_CALLS = {name: getattr(_core, name) for name in _PLAIN}


def _declined(*args):
    return None


def median_us(fn, calls: int = 500) -> float:
    """Median microseconds of ``calls`` calls of fn, after 50 warm-up calls."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def plain_and_ordinary_us(fn, rounds: int = 5):
    """(plain, ordinary) medians of fn over ``rounds`` alternating rounds of 100 calls each."""
    plain, ordinary = [], []
    for _ in range(rounds):
        for declined, times in ((False, plain), (True, ordinary)):
            for name in _PLAIN:
                setattr(_core, name, _declined if declined else _PLAIN_CALLS[name])
            try:
                times.append(median_us(fn, 100))
            finally:
                for name in _PLAIN:
                    setattr(_core, name, _PLAIN_CALLS[name])
    return statistics.median(plain), statistics.median(ordinary)


def calls(k_cache, v_cache, q, scales, sinks):
    """The step's calls against one cache: name -> call."""
    batch, heads, head_dim = q.shape[0], q.shape[2], q.shape[3]
    table = torch.arange(64, dtype=torch.int32).reshape(batch, 16)
    lengths = torch.tensor([20, 33, 5, 60], dtype=torch.int32)
    packed_q = q.reshape(batch, heads, head_dim)
    cu_q = torch.arange(batch + 1, dtype=torch.int32)
    out = {
        "flash_attn_with_kvcache (batched)": lambda: anyattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, **scales),
        "fa3 flash_attn_with_kvcache (batched)": lambda: fa3_interface.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, **scales),
        "flash_attn_varlen_func (block_table)": lambda: anyattn.flash_attn_varlen_func(
            packed_q, k_cache, v_cache, cu_q, None, 1, 60, seqused_k=lengths,
            block_table=table, **scales),
        "fa3 flash_attn_with_kvcache (cu_seqlens_q)": lambda: fa3_interface.flash_attn_with_kvcache(
            packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu_q,
            max_seqlen_q=1, **scales),
    }
    if sinks is not None:
        out["fa3 ... (cu_seqlens_q, sinks)"] = lambda: fa3_interface.flash_attn_with_kvcache(
            packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu_q,
            max_seqlen_q=1, sinks=sinks)
        # flash-attn's own decode step: the new token's keys rotated and appended (a contiguous
        # cache, so that repeated calls overwrite one position)
        cache_k = torch.zeros(batch, 64, k_cache.shape[2], head_dim)
        cache_v = torch.zeros(batch, 64, k_cache.shape[2], head_dim)
        new_k = torch.randn(batch, 1, k_cache.shape[2], head_dim)
        angles = torch.rand(128, head_dim // 2)
        cos, sin = angles.cos(), angles.sin()
        out["flash_attn_with_kvcache (rotary, append)"] = lambda: anyattn.flash_attn_with_kvcache(
            q, cache_k, cache_v, new_k, new_k, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=lengths, causal=True, rotary_interleaved=False)
    if scales:
        # sglang's and vLLM's descales: one scale expanded to (batch, nheads_k), strides 0
        expanded = dict(scales, **{name: scales[name][:1].expand(batch, k_cache.shape[2])
                                   for name in ("k_descale", "v_descale")})
        out["fa3 ... (cu_seqlens_q, expanded descales)"] = lambda: (
            fa3_interface.flash_attn_with_kvcache(
                packed_q, k_cache, v_cache, cache_seqlens=lengths, page_table=table,
                cu_seqlens_q=cu_q, max_seqlen_q=1, **expanded))
    if not scales:
        out["fa4 flash_attn_varlen_func (page_table)"] = lambda: (
            fa4_interface.flash_attn_varlen_func(packed_q, k_cache, v_cache, cu_seqlens_q=cu_q,
                                                 page_table=table, seqused_k=lengths))
    return out


def latent_calls(batch: int, page: int):
    """Absorbed MLA's decode step against a paged latent row: name -> call."""
    heads, rope, latent = 16, 64, 512
    g = torch.Generator().manual_seed(1)
    row = torch.randn(64, page, 1, latent + rope, generator=g).bfloat16()
    k_cache, v_cache = row[..., latent:], row[..., :latent]
    q_all = torch.randn(batch, heads, latent + rope, generator=g).bfloat16()
    qv, q = q_all[..., :latent], q_all[..., latent:]  # sglang slices one tensor
    table = torch.arange(64, dtype=torch.int32).reshape(batch, 16)
    lengths = torch.tensor([20, 33, 5, 60], dtype=torch.int32)
    cu_q = torch.arange(batch + 1, dtype=torch.int32)
    return {
        "fa3 flash_attn_with_kvcache (qv, cu_seqlens_q)": lambda: (
            fa3_interface.flash_attn_with_kvcache(
                q, k_cache, v_cache, qv=qv, cache_seqlens=lengths, page_table=table,
                cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_q, max_seqlen_q=1, causal=True)),
        "fa4 flash_attn_varlen_func (qv, page_table)": lambda: (
            fa4_interface.flash_attn_varlen_func(q, k_cache, v_cache, qv=qv, cu_seqlens_q=cu_q,
                                                 page_table=table, seqused_k=lengths,
                                                 causal=True)),
    }


def main() -> None:
    batch, heads, heads_k, head_dim, page = 4, 8, 2, 64, 16
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(64, page, heads_k, head_dim, generator=g)
    v_cache = torch.randn(64, page, heads_k, head_dim, generator=g)
    q = torch.randn(batch, 1, heads, head_dim, generator=g)
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 2.0, heads).to(torch.bfloat16),
                               requires_grad=False)  # as gpt-oss keeps them
    int8 = {name: (cache * 30).round().clamp(-127, 127).to(torch.int8)
            for name, cache in (("k", k_cache), ("v", v_cache))}
    scales = dict(k_descale=torch.full((heads_k,), 0.5), v_descale=torch.full((heads_k,), 0.25),
                  k_token_scale=torch.rand(64, page, heads_k, generator=g) + 0.5,
                  v_token_scale=torch.rand(64, page, heads_k, generator=g) + 0.5)
    cases = [("f32 cache", calls(k_cache, v_cache, q, {}, sinks)),
             ("int8 cache, token scales", calls(int8["k"], int8["v"], q.bfloat16(), scales,
                                                None)),
             ("bf16 latent row (absorbed MLA)", latent_calls(batch, page))]
    with torch.no_grad():
        for title, table in cases:
            print(f"{title:44} {'plain us':>9} {'ordinary us':>12} {'ordinary/plain':>15}")
            for name, fn in table.items():
                plain, ordinary = plain_and_ordinary_us(fn)
                print(f"{name:44} {plain:9.1f} {ordinary:12.1f} {ordinary / plain:15.2f}")


if __name__ == "__main__":
    main()
