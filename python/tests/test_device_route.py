"""Every public function on a real accelerator's tensors (device dispatch, docs/python.md): the
result stays on the device, keeps its dtype, and meets the same accuracy rules as the CPU kernels.

The device is ``ANYATTN_TEST_DEVICE`` (default ``cuda``); the module is skipped where torch or that
device is absent, which is every CI machine. On CUDA without the flash_attn package the calls run
through torch SDPA or the f32 math path (_dispatch.select_backend), so this checks those routes
end to end on real hardware: masks, sinks, ALiBi and softcap, LSE, autograd, varlen, the paged
cache's in-place append with rotary, and merging.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _dispatch  # noqa: E402
from conftest import to_numpy  # noqa: E402
from reference import attention_ref, check_2x, lse_eps, out_eps  # noqa: E402
from test_backward import CASES as BACKWARD_CASES  # noqa: E402
from test_backward import _api_kwargs, _case_data, _named  # noqa: E402
from test_kvcache import _rotary_table, _rotate  # noqa: E402
from test_varlen import _cu, _per_sequence_ref  # noqa: E402
from torch_reference import gradients, grads_2x, leaf  # noqa: E402

DEVICE = os.environ.get("ANYATTN_TEST_DEVICE", "cuda")


def _device_available(name: str) -> bool:
    if name == "cuda":
        return torch.cuda.is_available()
    module = getattr(torch, name, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


pytestmark = pytest.mark.skipif(not _device_available(DEVICE),
                                reason=f"torch sees no '{DEVICE}' device (ANYATTN_TEST_DEVICE)")

DTYPES = ["float32", "bfloat16", "float16"]

# torch's own CUDA SDPA kernels in float32 miss flash-attn's 2x rule by
# a small factor: on an H200 (torch 2.11), 1 of 7 forward cases (1.5x the bound) and 10 of 11
# autograd cases (up to 2.0x); the f32 math path meets it. Marked xfail, not
# loosened; docs/python.md ("Accuracy of the device routes") has the figures.
_SDPA_F32_REASON = "float32 through torch's CUDA SDPA kernels: just above the 2x rule (docs/python.md)"


def _expect_sdpa_f32_error(request, dtype, head_dim, head_dim_v, **features):
    """Mark the running test xfail (non-strict) when the call goes through SDPA in float32."""
    call = _dispatch.CallFeatures(dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v, **features)
    choice = _dispatch.select_backend(DEVICE, call, _dispatch.probe_environment(torch.device(DEVICE)))
    if dtype == "float32" and choice.backend == _dispatch.SDPA:
        request.applymarker(pytest.mark.xfail(reason=_SDPA_F32_REASON, strict=False))

# (B, Sq, Sk, Hq, Hk, D, options): each feature, fully masked rows, GQA, and all at once.
DENSE_CASES = {
    "plain": (2, 33, 40, 4, 4, 64, {}),
    "causal_sq_lt_sk": (1, 17, 40, 2, 2, 64, {"causal": True}),
    "causal_sq_gt_sk": (2, 40, 17, 2, 2, 32, {"causal": True}),
    "window": (1, 45, 50, 4, 2, 32, {"window_size": (5, 3)}),
    "softcap": (1, 30, 36, 2, 2, 32, {"softcap": 1.5, "softmax_scale": 0.7}),
    "alibi": (2, 29, 31, 4, 2, 48, {"alibi": True, "causal": True}),
    "sinks_fully_masked": (1, 20, 8, 2, 2, 16, {"sinks": True, "causal": True}),
    "gqa_d128": (1, 64, 96, 8, 2, 128, {"causal": True}),
    "everything": (2, 37, 45, 4, 2, 48,
                   {"causal": True, "window_size": (12, 0), "softcap": 2.0, "alibi": True,
                    "sinks": True}),
}


def _dense_inputs(case, dtype, seed):
    b, sq, sk, hq, hk, d, opts = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d))]
    tdtype = getattr(torch, dtype)
    cpu = [torch.from_numpy(a).to(tdtype) for a in arrays]
    alibi = rng.uniform(0.05, 0.6, hq).astype(np.float32) if opts.get("alibi") else None
    sinks = rng.standard_normal(hq).astype(np.float32) if opts.get("sinks") else None
    return cpu, alibi, sinks


def _to_device(x):
    return None if x is None else torch.as_tensor(x).to(DEVICE)


def _kwargs_on_device(kw):
    """The keyword arguments with every tensor moved to the device."""
    return {key: (val.to(DEVICE) if isinstance(val, torch.Tensor) else val)
            for key, val in kw.items()}


def _page_table(rng, batch, pages, spare):
    """(batch, pages) int32 block table: a shuffled choice of batch * pages + spare blocks."""
    blocks = rng.permutation(batch * pages + spare)[:batch * pages]
    return torch.from_numpy(blocks.astype(np.int32).reshape(batch, pages))


def _normal(rng, shape):
    return torch.from_numpy(rng.standard_normal(shape)).float()


def _check_cache_outputs(sequences, dtype, results):
    """The 2x rule for each (label, out (B, Sq, Hq, Dv), lse (B, Hq, Sq)) of ``results``, against
    the float64 reference and the naive ``dtype`` run of causal attention over ``sequences``:
    per batch row, (q (Sq, Hq, D) as the kernels see it, keys (n, Hk, D), values (n, Hk, Dv))."""
    ref = [attention_ref(q[None], k[None], v[None], causal=True) for q, k, v in sequences]
    naive = [attention_ref(q[None], k[None], v[None], causal=True, dtype=dtype)
             for q, k, v in sequences]
    ref_out, ref_lse = (np.concatenate([r[i] for r in ref]) for i in (0, 1))
    naive_out, naive_lse = (np.concatenate([r[i] for r in naive]) for i in (0, 1))
    for label, out, lse in results:
        check_2x(f"{label} out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
        check_2x(f"{label} lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


def _ref_kwargs(opts, alibi, sinks):
    return dict(softmax_scale=opts.get("softmax_scale"), causal=opts.get("causal", False),
                window=opts.get("window_size", (-1, -1)), softcap=opts.get("softcap", 0.0),
                alibi=alibi, sinks=sinks)


def _api_options(opts):
    return {key: opts[key] for key in ("softmax_scale", "causal", "window_size", "softcap")
            if key in opts}


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(DENSE_CASES))
def test_flash_attn_func_on_device_meets_the_2x_rule(request, name, dtype, return_lse):
    case = DENSE_CASES[name]
    opts = case[-1]
    _expect_sdpa_f32_error(request, dtype, case[5], case[5], softcap=bool(opts.get("softcap")),
                           alibi=bool(opts.get("alibi")), window="window_size" in opts,
                           sinks=bool(opts.get("sinks")), return_lse=return_lse)
    (q, k, v), alibi, sinks = _dense_inputs(case, dtype, seed=len(name))
    got = anyattn.flash_attn_func(*(_to_device(x) for x in (q, k, v)), alibi_slopes=_to_device(alibi),
                                  sinks=_to_device(sinks), return_attn_probs=return_lse,
                                  **_api_options(opts))
    out, lse = (got[0], got[1]) if return_lse else (got, None)
    assert out.device.type == DEVICE and out.dtype == q.dtype and out.shape == q.shape
    q64, k64, v64 = (to_numpy(x) for x in (q, k, v))
    ref_kw = _ref_kwargs(opts, alibi, sinks)
    ref_out, ref_lse = attention_ref(q64, k64, v64, **ref_kw)
    naive_out, naive_lse = attention_ref(q64, k64, v64, dtype=dtype, **ref_kw)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    if return_lse:
        assert lse.device.type == DEVICE and lse.dtype == torch.float32
        check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


def test_packed_forms_on_device_equal_the_unpacked_call():
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 19, 3, 4, 32, generator=g).to(DEVICE)
    whole = anyattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    packed = anyattn.flash_attn_qkvpacked_func(qkv, causal=True)
    kv = anyattn.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True)
    assert packed.device.type == DEVICE
    torch.testing.assert_close(packed, whole, rtol=0, atol=0)
    torch.testing.assert_close(kv, whole, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
def test_autograd_on_device_meets_the_2x_rule(request, case, dtype):
    q, k, v, dout, sinks, alibi, opts, _, _, ref64, naive, tdtype = _case_data(case, dtype)
    _expect_sdpa_f32_error(request, dtype, case[6], case[7], softcap=bool(opts.get("softcap")),
                           alibi=alibi is not None, window="window" in opts, sinks=sinks is not None)
    ins = [leaf(x.to(DEVICE), tdtype) for x in (q, k, v)] + [
        None if sinks is None else leaf(sinks.to(DEVICE), torch.float32)]
    kwargs = _api_kwargs(opts, alibi)
    kwargs["alibi_slopes"] = _to_device(kwargs["alibi_slopes"])

    def attend(q_, k_, v_, s_):
        return anyattn.flash_attn_func(q_, k_, v_, sinks=s_, **kwargs)

    out, got = gradients(attend, ins, dout.to(DEVICE))
    assert out.device.type == DEVICE
    got = {name: g.detach().cpu() for name, g in _named(got, sinks is not None).items()}
    for name in ("dq", "dk", "dv"):
        assert got[name].dtype == tdtype, name
    grads_2x({n: g.float() for n, g in got.items()}, ref64, naive, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_on_device_equals_dense_per_sequence(dtype, causal):
    lens_q, lens_k = [5, 0, 17, 1, 33], [9, 4, 17, 12, 33]
    hq, hk, d = 4, 2, 32
    rng = np.random.default_rng(3)
    tdtype = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(rng.standard_normal((sum(lens), h, d))).to(tdtype)
               for lens, h in ((lens_q, hq), (lens_k, hk), (lens_k, hk)))
    sinks = rng.standard_normal(hq).astype(np.float32)
    out, lse, _ = anyattn.flash_attn_varlen_func(
        *(x.to(DEVICE) for x in (q, k, v)), torch.from_numpy(_cu(lens_q)).to(DEVICE),
        torch.from_numpy(_cu(lens_k)).to(DEVICE), max(lens_q), max(lens_k), causal=causal,
        sinks=_to_device(sinks), return_attn_probs=True)
    assert out.device.type == DEVICE and out.dtype == tdtype
    q64, k64, v64 = (to_numpy(x) for x in (q, k, v))
    ref_out, ref_lse = _per_sequence_ref(q64, k64, v64, lens_q, lens_k, None, causal=causal, sinks=sinks)
    naive_out, naive_lse = _per_sequence_ref(q64, k64, v64, lens_q, lens_k, dtype, causal=causal,
                                             sinks=sinks)
    check_2x("out", to_numpy(out), ref_out, naive_out, out_eps(dtype, ref_out))
    check_2x("lse", to_numpy(lse), ref_lse, naive_lse, lse_eps(ref_lse))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
def test_paged_kvcache_on_device_matches_the_cpu_kernels(dtype, rotary):
    """The same call on the device and on the CPU: the caches end up holding the same rows and the
    outputs agree within the 2x rule's bound doubled (each side meets the rule on its own)."""
    rng = np.random.default_rng(11)
    b, sq, hq, hk, d, page, pages, s_new = 2, 2, 4, 2, 32, 16, 3, 2
    tdtype = getattr(torch, dtype)
    seqlens = torch.tensor([7, 30], dtype=torch.int32)
    table = torch.from_numpy(rng.permutation(b * pages + 2)[:b * pages].astype(np.int32).reshape(b, pages))
    q, k_new, v_new = (torch.from_numpy(rng.standard_normal(s)).to(tdtype)
                       for s in ((b, sq, hq, d), (b, s_new, hk, d), (b, s_new, hk, d)))
    k_cache, v_cache = (torch.from_numpy(rng.standard_normal((b * pages + 2, page, hk, d))).to(tdtype)
                        for _ in range(2))
    kw = dict(cache_seqlens=seqlens, block_table=table, causal=True, return_softmax_lse=True)
    cos, sin = _rotary_table(page * pages, 16)
    if rotary:
        kw.update(rotary_cos=torch.from_numpy(cos), rotary_sin=torch.from_numpy(sin),
                  rotary_interleaved=rotary == "interleaved")
    dev_caches = [k_cache.to(DEVICE), v_cache.to(DEVICE)]
    dev_kw = {key: (val.to(DEVICE) if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
    out_dev, lse_dev = anyattn.flash_attn_with_kvcache(q.to(DEVICE), *dev_caches, k_new.to(DEVICE),
                                                       v_new.to(DEVICE), **dev_kw)
    out_cpu, lse_cpu = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kw)
    assert out_dev.device.type == DEVICE and out_dev.dtype == tdtype
    # Appended rows: the new keys, rotated in f32 and rounded once on both sides.
    torch.testing.assert_close(dev_caches[1].cpu(), v_cache, rtol=0, atol=0)
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -23
    tol = ulp * 2 * float(k_new.float().abs().max())
    torch.testing.assert_close(dev_caches[0].cpu().float(), k_cache.float(), rtol=0, atol=tol)
    # The reference: each sequence's logical cache (as the CPU call left it) against rotated q.
    sequences = []
    for bi in range(b):
        n = int(seqlens[bi]) + s_new
        rows = [(int(table[bi, p // page]), p % page) for p in range(n)]
        keys = np.stack([to_numpy(k_cache[i, r]) for i, r in rows])
        vals = np.stack([to_numpy(v_cache[i, r]) for i, r in rows])
        qb = to_numpy(q[bi])
        if rotary:
            pos = np.arange(int(seqlens[bi]), int(seqlens[bi]) + sq)
            qb = _rotate(qb, cos[pos], sin[pos], rotary == "interleaved")
        sequences.append((qb, keys, vals))
    _check_cache_outputs(sequences, dtype,
                         (("device", out_dev, lse_dev), ("cpu", out_cpu, lse_cpu)))


KV8_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "int8": "int8"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cache_dtype", sorted(KV8_DTYPES))
def test_8bit_paged_kvcache_on_device_matches_the_cpu_kernels(cache_dtype, dtype):
    """An 8-bit paged cache with token scales and a per-(sequence, kv head) value descale,
    appended to with rotary: the device leaves the same bytes and scales in the caches as the CPU
    kernels, and its output meets the 2x rule against the dequantized cache."""
    rng = np.random.default_rng(12)
    b, sq, hq, hk, d, page, pages, s_new = 2, 2, 4, 2, 32, 16, 3, 2
    tdtype, cdtype = getattr(torch, dtype), getattr(torch, KV8_DTYPES[cache_dtype])
    seqlens = torch.tensor([7, 30], dtype=torch.int32)
    table = _page_table(rng, b, pages, 2)
    q, k_new, v_new = (torch.from_numpy(rng.standard_normal(s)).to(tdtype)
                       for s in ((b, sq, hq, d), (b, s_new, hk, d), (b, s_new, hk, d)))
    k_cache, _, k_token = anyattn.quantize_kv_cache(_normal(rng, (b * pages + 2, page, hk, d)),
                                                    cdtype, "token")
    v_descale = torch.from_numpy(rng.uniform(0.02, 0.05, (b, hk)).astype(np.float32))
    v_cache = anyattn.quantize_kv_cache(_normal(rng, (b * pages + 2, page, hk, d)), cdtype,
                                        "tensor", descale=0.03).cache
    cos, sin = _rotary_table(page * pages, 16)
    kw = dict(cache_seqlens=seqlens, block_table=table, causal=True, return_softmax_lse=True,
              rotary_cos=torch.from_numpy(cos), rotary_sin=torch.from_numpy(sin),
              rotary_interleaved=False, v_descale=v_descale)
    v_token = torch.ones(k_token.shape)  # token scales come in pairs; the values' are 1
    dev = [x.to(DEVICE) for x in (k_cache, v_cache, k_token, v_token)]
    out_dev, lse_dev = anyattn.flash_attn_with_kvcache(
        q.to(DEVICE), dev[0], dev[1], k_new.to(DEVICE), v_new.to(DEVICE), k_token_scale=dev[2],
        v_token_scale=dev[3], **_kwargs_on_device(kw))
    out_cpu, lse_cpu = anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                       k_token_scale=k_token,
                                                       v_token_scale=v_token, **kw)
    assert out_dev.device.type == DEVICE and out_dev.dtype == tdtype
    # The new rows: rotated in float32 on both sides (these inputs round to the same bytes).
    for name, got, want in (("k_cache", dev[0], k_cache), ("v_cache", dev[1], v_cache)):
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), name
    torch.testing.assert_close(dev[2].cpu(), k_token, rtol=2.0 ** -23, atol=0)
    torch.testing.assert_close(dev[3].cpu(), v_token, rtol=2.0 ** -23, atol=0)
    keys = anyattn.dequantize_kv_cache(k_cache, None, k_token, torch.float64)
    values = anyattn.dequantize_kv_cache(v_cache, None, v_token, torch.float64)
    sequences = []
    for bi in range(b):
        n = int(seqlens[bi]) + s_new
        rows = [(int(table[bi, p // page]), p % page) for p in range(n)]
        kb = np.stack([keys[i, r].numpy() for i, r in rows])
        vb = np.stack([values[i, r].numpy() for i, r in rows])
        vb = vb * v_descale[bi].double().numpy()[:, None]
        pos = np.arange(int(seqlens[bi]), int(seqlens[bi]) + sq)
        sequences.append((_rotate(to_numpy(q[bi]), cos[pos], sin[pos], False), kb, vb))
    _check_cache_outputs(sequences, dtype,
                         (("device", out_dev, lse_dev), ("cpu", out_cpu, lse_cpu)))


@pytest.mark.parametrize("cache_dtype", sorted(KV8_DTYPES))
def test_8bit_paged_varlen_on_device_matches_the_cpu_kernels(cache_dtype):
    rng = np.random.default_rng(5)
    b, hq, hk, d, page, pages = 3, 4, 2, 32, 8, 3
    cdtype = getattr(torch, KV8_DTYPES[cache_dtype])
    q_lens, k_lens = [3, 1, 5], [10, 24, 7]
    table = _page_table(rng, b, pages, 1)
    k8, k_descale, _ = anyattn.quantize_kv_cache(_normal(rng, (b * pages + 1, page, hk, d)),
                                                 cdtype, "head")
    v8, _, v_token = anyattn.quantize_kv_cache(_normal(rng, (b * pages + 1, page, hk, d)),
                                               cdtype, "token")
    q = torch.from_numpy(rng.standard_normal((sum(q_lens), hq, d))).to(torch.bfloat16)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    args = (q, k8, v8, cu_q, None, max(q_lens), page * pages)
    kw = dict(causal=True, block_table=table, seqused_k=torch.tensor(k_lens, dtype=torch.int32),
              k_descale=k_descale, v_token_scale=v_token, k_token_scale=torch.ones(v_token.shape))
    out_cpu = anyattn.flash_attn_varlen_func(*args, **kw)
    out_dev = anyattn.flash_attn_varlen_func(*(_to_device(x) for x in args[:4]), None, *args[5:],
                                             **_kwargs_on_device(kw))
    assert out_dev.device.type == DEVICE and out_dev.dtype == torch.bfloat16
    keys = anyattn.dequantize_kv_cache(k8, k_descale, None, torch.float64)
    values = anyattn.dequantize_kv_cache(v8, None, v_token, torch.float64)
    for bi in range(b):
        rows = slice(int(cu_q[bi]), int(cu_q[bi + 1]))
        kb = torch.cat([keys[int(p)] for p in table[bi]])[:k_lens[bi]].numpy()[None]
        vb = torch.cat([values[int(p)] for p in table[bi]])[:k_lens[bi]].numpy()[None]
        qb = to_numpy(q[rows])[None]
        o, _ = attention_ref(qb, kb, vb, causal=True)
        no, _ = attention_ref(qb, kb, vb, causal=True, dtype="bfloat16")
        for label, out in (("device", out_dev), ("cpu", out_cpu)):
            check_2x(f"{label} out[{bi}]", to_numpy(out[rows])[None], o, no, out_eps("bfloat16", o))


@pytest.mark.parametrize("cache_dtype", sorted(KV8_DTYPES))
def test_fa3_packed_call_with_an_8bit_cache_on_device_matches_the_cpu(cache_dtype):
    """FA3's flash_attn_with_kvcache with packed queries and new keys (cu_seqlens_q,
    cu_seqlens_k_new) into a paged 8-bit cache: device tensors leave the same bytes and scales
    and give the same output as CPU tensors."""
    fa3 = pytest.importorskip("anyattn.fa3_interface")
    g = torch.Generator().manual_seed(4)
    cdtype = getattr(torch, KV8_DTYPES[cache_dtype])
    b, hq, hk, d, page, pages = 2, 4, 2, 32, 8, 3
    table = torch.randperm(b * pages + 1, generator=g)[:b * pages].reshape(b, pages).int()
    k8, k_descale, _ = anyattn.quantize_kv_cache(torch.randn(b * pages + 1, page, hk, d,
                                                             generator=g), cdtype, "head")
    v8, _, v_token = anyattn.quantize_kv_cache(torch.randn(b * pages + 1, page, hk, d,
                                                           generator=g), cdtype, "token")
    k_token = torch.ones(v_token.shape)
    q = torch.randn(5, hq, d, generator=g, dtype=torch.float64).to(torch.bfloat16)
    k_new, v_new = (torch.randn(3, hk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    kw = dict(cache_seqlens=torch.tensor([4, 9], dtype=torch.int32), page_table=table,
              cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32),
              cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32), max_seqlen_q=3,
              causal=True, k_descale=k_descale * 2, return_softmax_lse=True)
    cpu = [x.clone() for x in (k8, v8, k_token, v_token)]
    out_cpu, lse_cpu, *_ = fa3.flash_attn_with_kvcache(
        q, cpu[0], cpu[1], k_new, v_new, k_token_scale=cpu[2], v_token_scale=cpu[3], **kw)
    dev = [x.to(DEVICE) for x in (k8, v8, k_token, v_token)]
    out_dev, lse_dev, *_ = fa3.flash_attn_with_kvcache(
        q.to(DEVICE), dev[0], dev[1], k_new.to(DEVICE), v_new.to(DEVICE), k_token_scale=dev[2],
        v_token_scale=dev[3], **_kwargs_on_device(kw))
    assert out_dev.device.type == DEVICE and out_dev.dtype == torch.bfloat16
    for name, x, y in zip(("k_cache", "v_cache"), dev, cpu):
        assert torch.equal(x.cpu().view(torch.uint8), y.view(torch.uint8)), name
    assert torch.equal(dev[3].cpu(), cpu[3]) and torch.equal(dev[2].cpu(), cpu[2])
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=0, atol=0)
    torch.testing.assert_close(lse_dev.cpu(), lse_cpu, rtol=0, atol=0)


def test_merge_on_device_matches_the_cpu_kernel_including_empty_halves():
    g = torch.Generator().manual_seed(2)
    out_a, out_b = torch.randn(2, 6, 3, 16, generator=g), torch.randn(2, 6, 3, 16, generator=g)
    lse_a, lse_b = torch.randn(2, 3, 6, generator=g), torch.randn(2, 3, 6, generator=g)
    lse_a[0, 1, :] = -torch.inf
    lse_b[1, :, 2] = -torch.inf
    lse_a[1, 0, 4] = lse_b[1, 0, 4] = -torch.inf
    out_a[1, 4, 0] = torch.nan  # an empty half's rows are ignored, whatever they hold
    expected = anyattn.merge_attention_states(out_a, lse_a, out_b, lse_b)
    got = anyattn.merge_attention_states(*(x.to(DEVICE) for x in (out_a, lse_a, out_b, lse_b)))
    assert all(x.device.type == DEVICE for x in got)
    for name, x, y in zip(("out", "lse"), got, expected):
        torch.testing.assert_close(x.cpu(), y, rtol=4 * 2.0 ** -23, atol=4 * 2.0 ** -23, msg=name)
    in_place = [x.to(DEVICE) for x in (out_a, lse_a, out_b, lse_b)]
    anyattn.merge_attention_states_(*in_place)
    torch.testing.assert_close(in_place[0], got[0], rtol=0, atol=0)
    torch.testing.assert_close(in_place[1], got[1], rtol=0, atol=0)


def test_backends_reports_the_device_route():
    info = anyattn.backends()
    entry = info["cuda" if DEVICE == "cuda" else "other"]
    assert entry["backend"] in ("flash_attn", "sdpa")
    assert "torch sees no CUDA device" not in entry["reason"]


def test_compiled_call_on_device_matches_eager():
    q, k, v = (torch.randn(1, 24, 2, 32, generator=torch.Generator().manual_seed(s)).to(DEVICE)
               for s in range(3))
    compiled = torch.compile(anyattn.flash_attn_func)
    torch.testing.assert_close(compiled(q, k, v, causal=True), anyattn.flash_attn_func(q, k, v, causal=True))
