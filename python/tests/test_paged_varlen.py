"""flash_attn_varlen_func with block_table (paged varlen, as vLLM calls it): packed queries
against a paged KV cache equal dense attention on each sequence's logical keys."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from anyattn import varlen
from anyattn._options import make_options
from conftest import FRAMEWORK_DTYPES, make_inputs, to_numpy
from reference import check_2x, lse_eps, out_eps
from test_varlen import FEATURES, _cu, _per_sequence_ref

# A decode step, an empty sequence, a prefill chunk, a single query with a long history, and a
# full prefill: the mixed batches a serving engine sends.
LENS_Q = [1, 0, 6, 1, 12]
LENS_K = [9, 4, 17, 40, 12]


def _paged(packed, lens_k, page, rng, dtype_of):
    """Scatters each packed (total_k, H, D) float64 array's sequences into a paged cache, through
    one shuffled block table.

    Returns ([cache (num_blocks, page, H, D) made by dtype_of, one per array], block_table (B,
    max_blocks) int32). Unused blocks and slots hold large values that would show if read."""
    blocks_per_seq = max(-(-n // page) for n in lens_k)
    num_blocks = blocks_per_seq * len(lens_k) + 3
    order = rng.permutation(num_blocks)
    table = order[: blocks_per_seq * len(lens_k)].reshape(len(lens_k), blocks_per_seq)
    cu = _cu(lens_k)
    caches = []
    for x in packed:
        cache = np.full((num_blocks, page) + x.shape[1:], 1e4)
        for b, n in enumerate(lens_k):
            for pos in range(n):
                cache[table[b, pos // page], pos % page] = x[cu[b] + pos]
        caches.append(dtype_of(cache))
    return caches, table.astype(np.int32)


@pytest.mark.parametrize("framework,dtype", FRAMEWORK_DTYPES)
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("page", [1, 16])
def test_paged_varlen_equals_dense_per_sequence(framework, dtype, feature, page):
    spec = FEATURES[feature]
    hq, hk, d = 4, 2, 32
    (q,), (q64,) = make_inputs(framework, dtype, [(sum(LENS_Q), hq, d)], 3)
    _, (k64, v64) = make_inputs("numpy", "float64", [(sum(LENS_K), hk, d)] * 2, 4)
    rng = np.random.default_rng(1)

    def as_framework(x, index=False):
        if framework == "numpy":
            return x if index else x.astype(dtype)
        import torch
        t = torch.from_numpy(x)
        return t if index else t.to(getattr(torch, dtype))

    # Round the keys to dtype once, so that the reference sees what the kernel reads.
    k64, v64 = (to_numpy(as_framework(x)) for x in (k64, v64))
    (k_cache, v_cache), table = _paged((k64, v64), LENS_K, page, rng, as_framework)
    alibi = None
    if spec.get("alibi"):
        alibi = rng.uniform(0.1, 1.0, (len(LENS_Q), hq)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32) if spec.get("sinks") else None
    kw = {key: spec[key] for key in ("causal", "window_size", "softcap") if key in spec}
    out, lse, s_dmask = anyattn.flash_attn_varlen_func(
        q, k_cache, v_cache, as_framework(_cu(LENS_Q), True), as_framework(_cu(LENS_K), True),
        max(LENS_Q), max(LENS_K), block_table=as_framework(table, True),
        alibi_slopes=None if alibi is None else as_framework(alibi, True),
        sinks=None if sinks is None else as_framework(sinks, True), return_attn_probs=True, **kw)
    assert tuple(s_dmask.shape) == (0,) and type(out) is type(q) and out.dtype == q.dtype
    assert tuple(out.shape) == (sum(LENS_Q), hq, d) and tuple(lse.shape) == (hq, sum(LENS_Q))
    ref_kw = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi=alibi, sinks=sinks)
    ref_out, ref_lse = _per_sequence_ref(q64, k64, v64, LENS_Q, LENS_K, None, **ref_kw)
    naive_out, naive_lse = _per_sequence_ref(q64, k64, v64, LENS_Q, LENS_K, dtype, **ref_kw)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


def _small_case(seed=0):
    rng = np.random.default_rng(seed)
    lens_q, lens_k, page, hk = [2, 3], [5, 7], 4, 2
    q = rng.standard_normal((sum(lens_q), 4, 16)).astype(np.float32)
    k64 = rng.standard_normal((sum(lens_k), hk, 16))
    v64 = rng.standard_normal((sum(lens_k), hk, 16))
    (k_cache, v_cache), table = _paged((k64, v64), lens_k, page, rng,
                                       lambda x: x.astype(np.float32))
    return q, k_cache, v_cache, _cu(lens_q), _cu(lens_k), table, lens_k


def test_key_counts_from_seqused_k_or_cu_seqlens_k():
    q, kc, vc, cu_q, cu_k, table, lens_k = _small_case()
    by_cu = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, causal=True,
                                           block_table=table)
    used = np.array(lens_k, np.int32)
    by_used = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, None, 3, 7, causal=True,
                                             block_table=table, seqused_k=used)
    np.testing.assert_array_equal(by_used, by_cu)
    # seqused_k wins over cu_seqlens_k: sequence 1 limited to 4 keys equals its 4-key dense call.
    fewer = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, block_table=table,
                                           seqused_k=np.array([5, 4], np.int32))
    k1 = np.stack([kc[table[1, p // 4], p % 4] for p in range(4)])
    v1 = np.stack([vc[table[1, p // 4], p % 4] for p in range(4)])
    dense = anyattn.flash_attn_func(q[None, 2:], k1[None], v1[None])[0]
    np.testing.assert_allclose(fewer[2:], dense, rtol=1e-6, atol=1e-6)


def test_equals_flash_attn_with_kvcache_per_sequence():
    q, kc, vc, cu_q, cu_k, table, lens_k = _small_case(2)
    out = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, causal=True, softcap=3.0,
                                         block_table=table)
    for b in range(2):
        one = anyattn.flash_attn_with_kvcache(q[None, cu_q[b]:cu_q[b + 1]], kc, vc,
                                              cache_seqlens=np.array([lens_k[b]], np.int32),
                                              block_table=table[b:b + 1], causal=True, softcap=3.0)
        np.testing.assert_array_equal(out[cu_q[b]:cu_q[b + 1]], one[0])


def test_bad_arguments_name_the_parameter():
    q, kc, vc, cu_q, cu_k, table, _ = _small_case()
    call = anyattn.flash_attn_varlen_func
    with pytest.raises(ValueError, match="cu_seqlens_k, seqused_k: .*both are None"):
        call(q, kc, vc, cu_q, None, 3, 7, block_table=table)
    with pytest.raises(ValueError, match=r"seqused_k: expected shape \(2,\)"):
        call(q, kc, vc, cu_q, cu_k, 3, 7, block_table=table, seqused_k=np.array([1], np.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens_k: expected shape \(3,\)"):
        call(q, kc, vc, cu_q, cu_k[:2], 3, 7, block_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_k: sequence 1 has -2 keys"):
        call(q, kc, vc, cu_q, np.array([0, 5, 3], np.int32), 3, 7, block_table=table)
    with pytest.raises(ValueError, match=r"seqused_k: sequence 0 has 9 keys; supported: 0 \.\. 8"):
        call(q, kc, vc, cu_q, cu_k, 3, 9, block_table=table, seqused_k=np.array([9, 1], np.int32))
    with pytest.raises(ValueError, match=r"k: expected shape \(num_blocks, page_block_size"):
        call(q, kc[:, 0], vc, cu_q, cu_k, 3, 7, block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        call(q, kc, vc, cu_q, cu_k, 3, 7, block_table=table + kc.shape[0])
    with pytest.raises(ValueError, match="max_seqlen_q"):
        call(q, kc, vc, cu_q, cu_k, 2, 7, block_table=table)


def test_torch_dropout_and_backward_are_refused():
    torch = pytest.importorskip("torch")
    q, kc, vc, cu_q, cu_k, table, _ = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                       for x in _small_case())
    with pytest.raises(NotImplementedError, match="dropout_p is 0.5.*block_table"):
        anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, dropout_p=0.5,
                                       block_table=table)
    q.requires_grad_(True)
    out = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, block_table=table)
    with torch.no_grad():
        expected = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, block_table=table)
    assert torch.equal(out.detach(), expected)
    with pytest.raises(NotImplementedError, match="block_table.*no backward pass"):
        out.sum().backward()


def test_op_traces_with_fake_tensors_and_compiles():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, kc, vc = torch.empty(5, 4, 16), torch.empty(6, 4, 2, 16), torch.empty(6, 4, 2, 8)
        cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        lens = torch.tensor([3, 7], dtype=torch.int32)
        table = torch.zeros(2, 2, dtype=torch.int32)
        out, lse = torch.ops.anyattn.fwd_kvcache_varlen(q, kc, vc, cu, 3, lens, -1, None,
                                                        None, table, 0.0, 0.0, True, -1, -1, None,
                                                        None, 0)
        assert out.shape == (5, 4, 8) and lse.shape == (4, 5) and lse.dtype == torch.float32

    q, kc, vc, cu_q, cu_k, table, _ = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                       for x in _small_case(3))

    @torch.compile(backend="eager", fullgraph=True)
    def step(q, kc, vc, cu_q, cu_k, table):
        return anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, causal=True,
                                              block_table=table)

    eager = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, causal=True,
                                           block_table=table)
    assert torch.equal(step(q, kc, vc, cu_q, cu_k, table), eager)


def test_device_route_gathers_the_same_keys():
    """The off-CPU path (every sequence's pages gathered at once, then one packed attention) run
    on CPU tensors: it agrees with the paged kernel, so the gather reads the keys it reads."""
    torch = pytest.importorskip("torch")
    q, kc, vc, cu_q, cu_k, table, lens_k = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                            for x in _small_case(4))
    options = make_options(0.0, None, True, (-1, -1), 0.0, False)
    lengths = torch.tensor(lens_k, dtype=torch.int32)
    out, lse = varlen._paged_varlen_on_device(q, kc, vc, cu_q, 3, lengths, table,
                                                      options, None, None, True)
    ref, ref_lse, _ = anyattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 7, causal=True,
                                                     block_table=table, return_attn_probs=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "float8_e5m2", "int8"])
def test_device_route_reads_an_8bit_cache_as_the_kernel_does(cache_dtype):
    """The off-CPU path on CPU tensors with an 8-bit paged cache (per-sequence K descales, V token
    scales): the gathered pages are dequantized as the kernel reads them."""
    torch = pytest.importorskip("torch")
    from anyattn._kv_scales import cache_scales

    q, kc, vc, cu_q, cu_k, table, lens_k = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                            for x in _small_case(5))
    dtype = getattr(torch, cache_dtype)
    k8 = anyattn.quantize_kv_cache(kc, dtype, "tensor", descale=1.0).cache
    v8, _, v_token = anyattn.quantize_kv_cache(vc, dtype, "token")
    g = torch.Generator().manual_seed(1)
    k_descale = torch.rand(2, kc.shape[2], generator=g) + 0.5
    scale_args = (k_descale, None, torch.ones(v_token.shape), v_token)
    options = make_options(0.0, None, True, (-1, -1), 0.0, False)
    lengths = torch.tensor(lens_k, dtype=torch.int32)
    out, lse = varlen._paged_varlen_on_device(q, k8, v8, cu_q, 3, lengths, table, options, None,
                                              None, True, cache_scales(k8, v8, 2, *scale_args))
    ref, ref_lse, _ = anyattn.flash_attn_varlen_func(
        q, k8, v8, cu_q, cu_k, 3, 7, causal=True, block_table=table, return_attn_probs=True,
        k_descale=k_descale, k_token_scale=scale_args[2], v_token_scale=v_token)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
