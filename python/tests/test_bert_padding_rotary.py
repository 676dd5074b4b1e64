"""anyattn.bert_padding and anyattn.rotary against float64 references written out here: per-token
loops with explicit complex multiplication for rotary, per-element loops for padding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from anyattn.bert_padding import (  # noqa: E402
    IndexFirstAxis,
    IndexFirstAxisResidual,
    IndexPutFirstAxis,
    index_first_axis,
    index_first_axis_residual,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)
from anyattn.rotary import (  # noqa: E402
    ApplyRotaryEmb,
    RotaryEmbedding,
    apply_rotary_emb,
    apply_rotary_emb_func,
    apply_rotary_emb_kv_,
    apply_rotary_emb_qkv_,
    apply_rotary_emb_torch,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _tables(gen, seqlen_ro: int, rotary_dim: int, dtype):
    angle = torch.rand(seqlen_ro, rotary_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


# ---------------------------------------------------------------------------------------------
# Rotary reference: rotate one token's heads by complex multiplication in float64.
# ---------------------------------------------------------------------------------------------


def _pair_channels(rotary_dim: int, interleaved: bool):
    if interleaved:
        return list(range(0, rotary_dim, 2)), list(range(1, rotary_dim, 2))
    half = rotary_dim // 2
    return list(range(half)), list(range(half, rotary_dim))


def _rotate_token(row, cos_row, sin_row, interleaved, conjugate=False):
    """row: (nheads, headdim) float64; cos_row/sin_row: (rotary_dim / 2,)."""
    real, imag = _pair_channels(2 * cos_row.numel(), interleaved)
    z = torch.complex(row[:, real], row[:, imag])
    turn = torch.complex(cos_row, -sin_row if conjugate else sin_row)
    rotated = z * turn
    out = row.clone()
    out[:, real], out[:, imag] = rotated.real, rotated.imag
    return out


def _offset_of(offsets, b):
    return int(offsets[b]) if isinstance(offsets, torch.Tensor) else offsets


def reference_rotary(x, cos, sin, interleaved, offsets=0, cu_seqlens=None, conjugate=False):
    """float64 result of rotating x token by token."""
    x64, cos64, sin64 = x.double(), cos.double(), sin.double()
    out = x64.clone()
    if cu_seqlens is None:
        for b in range(x.shape[0]):
            for s in range(x.shape[1]):
                p = _offset_of(offsets, b) + s
                out[b, s] = _rotate_token(x64[b, s], cos64[p], sin64[p], interleaved, conjugate)
        return out
    bounds = cu_seqlens.tolist()
    for b in range(len(bounds) - 1):
        for t in range(bounds[b], bounds[b + 1]):
            p = _offset_of(offsets, b) + t - bounds[b]
            out[t] = _rotate_token(x64[t], cos64[p], sin64[p], interleaved, conjugate)
    return out


def assert_rounded_from(actual, exact):
    """actual is exact (float64) computed in float32 or better and rounded once to its dtype."""
    eps = torch.finfo(actual.dtype).eps
    err = (actual.double() - exact).abs()
    bound = eps * exact.abs() + 1e-6
    assert bool((err <= bound).all()), f"max error {err.max().item()} (dtype {actual.dtype})"


def _offsets(kind, batch, seqlen_ro, seqlen, gen):
    if kind == "zero":
        return 0
    if kind == "int":
        return seqlen_ro - seqlen
    return torch.randint(0, seqlen_ro - seqlen + 1, (batch,), generator=gen, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# apply_rotary_emb
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 10])
@pytest.mark.parametrize("offset_kind", ["zero", "int", "tensor"])
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rotary_emb_matches_reference(dtype, interleaved, rotary_dim, offset_kind, inplace):
    gen = _generator(1)
    batch, seqlen, nheads, headdim, seqlen_ro = 3, 7, 2, 16, 12
    x = _randn(gen, batch, seqlen, nheads, headdim, dtype=dtype)
    x_before = x.clone()
    cos, sin = _tables(gen, seqlen_ro, rotary_dim, dtype)
    offsets = _offsets(offset_kind, batch, seqlen_ro, seqlen, gen)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, inplace=inplace,
                           seqlen_offsets=offsets)
    expected = reference_rotary(x_before, cos, sin, interleaved, offsets)
    assert out.shape == x.shape and out.dtype == dtype
    assert_rounded_from(out, expected)
    assert torch.equal(out[..., rotary_dim:], x_before[..., rotary_dim:])
    if inplace:
        assert out is x
    else:
        assert out.data_ptr() != x.data_ptr()
        assert torch.equal(x, x_before)


def test_func_alias_and_upstream_torch_helper():
    gen = _generator(2)
    x = _randn(gen, 2, 5, 3, 8)
    cos, sin = _tables(gen, 5, 6, torch.float32)
    assert apply_rotary_emb_func is apply_rotary_emb
    for interleaved in (False, True):
        expected = reference_rotary(x, cos, sin, interleaved)
        assert_rounded_from(apply_rotary_emb_torch(x, cos, sin, interleaved), expected)


def test_cos_sin_in_float32_with_bfloat16_x():
    gen = _generator(3)
    x = _randn(gen, 2, 6, 2, 8, dtype=torch.bfloat16)
    cos, sin = _tables(gen, 6, 8, torch.float32)
    out = apply_rotary_emb(x, cos, sin)
    assert out.dtype == torch.bfloat16
    assert_rounded_from(out, reference_rotary(x, cos, sin, False))


def test_non_contiguous_x():
    gen = _generator(4)
    base = _randn(gen, 2, 3, 6, 4, 8)
    x = base.permute(0, 2, 1, 3, 4)[:, :, 1]  # (2, 6, 4, 8) with odd strides
    cos, sin = _tables(gen, 6, 8, torch.float32)
    expected = reference_rotary(x.clone(), cos, sin, True)
    assert_rounded_from(apply_rotary_emb(x, cos, sin, interleaved=True), expected)
    apply_rotary_emb(x, cos, sin, interleaved=True, inplace=True)
    assert_rounded_from(base.permute(0, 2, 1, 3, 4)[:, :, 1], expected)


def _varlen_case(gen, dtype, offset_kind, seqlen_ro=14):
    lengths = [3, 0, 6, 1]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu_seqlens[-1]) + 2  # two rows past the last sequence must pass through
    x = _randn(gen, total, 3, 12, dtype=dtype)
    offsets = _offsets(offset_kind, len(lengths), seqlen_ro, max(lengths), gen)
    return x, cu_seqlens, max(lengths), offsets


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset_kind", ["zero", "int", "tensor"])
@pytest.mark.parametrize("inplace", [False, True])
def test_varlen_matches_reference(dtype, interleaved, offset_kind, inplace):
    gen = _generator(5)
    x, cu_seqlens, max_seqlen, offsets = _varlen_case(gen, dtype, offset_kind)
    x_before = x.clone()
    cos, sin = _tables(gen, 14, 8, dtype)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, inplace=inplace,
                           seqlen_offsets=offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    expected = reference_rotary(x_before, cos, sin, interleaved, offsets, cu_seqlens)
    assert_rounded_from(out, expected)
    assert torch.equal(out[-2:], x_before[-2:])
    assert (out is x) == inplace


def test_varlen_without_sequences_passes_rows_through():
    gen = _generator(28)
    x = _randn(gen, 3, 2, 8)
    cos, sin = _tables(gen, 4, 8, torch.float32)
    empty = torch.zeros(1, dtype=torch.int32)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(0, dtype=torch.int32),
                           cu_seqlens=empty, max_seqlen=0)
    assert torch.equal(out, x) and out is not x


@pytest.mark.parametrize("interleaved", [False, True])
def test_varlen_agrees_with_padded_batch(interleaved):
    gen = _generator(6)
    batch, seqlen = 3, 9
    x = _randn(gen, batch, seqlen, 2, 16)
    mask = torch.arange(seqlen) < torch.tensor([[9], [4], [7]])
    cos, sin = _tables(gen, 2 * seqlen, 12, torch.float32)
    offsets = torch.tensor([0, 5, 9], dtype=torch.int64)
    x_unpad, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, mask)
    out_unpad = apply_rotary_emb(x_unpad, cos, sin, interleaved=interleaved,
                                 seqlen_offsets=offsets, cu_seqlens=cu_seqlens,
                                 max_seqlen=max_seqlen)
    padded = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    assert torch.equal(pad_input(out_unpad, indices, batch, seqlen),
                       padded * mask[:, :, None, None])


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset_kind", ["int", "tensor"])
def test_gradcheck_padded(interleaved, offset_kind):
    gen = _generator(7)
    x = _randn(gen, 2, 4, 2, 6, dtype=torch.float64).requires_grad_()
    cos, sin = _tables(gen, 8, 4, torch.float64)
    offsets = _offsets(offset_kind, 2, 8, 4, gen)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb(t, cos, sin, interleaved=interleaved, seqlen_offsets=offsets),
        (x,))


@pytest.mark.parametrize("offset_kind", ["int", "tensor"])
def test_gradcheck_varlen(offset_kind):
    gen = _generator(8)
    x, cu_seqlens, max_seqlen, offsets = _varlen_case(gen, torch.float64, offset_kind)
    cos, sin = _tables(gen, 14, 8, torch.float64)
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb(t, cos, sin, seqlen_offsets=offsets, cu_seqlens=cu_seqlens,
                                   max_seqlen=max_seqlen), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace_backward_rotates_by_the_conjugate(dtype, interleaved):
    gen = _generator(9)
    x = _randn(gen, 2, 5, 3, 8, dtype=dtype).requires_grad_()
    x_before = x.detach().clone()
    cos, sin = _tables(gen, 9, 6, dtype)
    offsets = torch.tensor([4, 1])
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, inplace=True,
                           seqlen_offsets=offsets)
    # As upstream: the result shares x's storage and x itself now holds the rotation.
    assert out.data_ptr() == x.data_ptr()
    assert_rounded_from(x.detach(), reference_rotary(x_before, cos, sin, interleaved, offsets))
    grad = _randn(gen, *out.shape, dtype=dtype)
    grad_before = grad.clone()
    out.backward(grad)
    expected = reference_rotary(grad_before, cos, sin, interleaved, offsets, conjugate=True)
    assert_rounded_from(x.grad, expected)
    assert torch.equal(grad, grad_before)
    assert isinstance(out.grad_fn, ApplyRotaryEmb._backward_cls)


def test_cos_and_sin_get_no_gradient():
    gen = _generator(10)
    x = _randn(gen, 1, 3, 1, 4).requires_grad_()
    cos, sin = _tables(gen, 3, 4, torch.float32)
    cos.requires_grad_()
    apply_rotary_emb(x, cos, sin).sum().backward()
    assert cos.grad is None and x.grad is not None


# ---------------------------------------------------------------------------------------------
# Packed qkv and kv
# ---------------------------------------------------------------------------------------------


def _expected_qkv(qkv, cos, sin, cos_k, sin_k, interleaved, offsets, num_heads_q):
    if qkv.ndim == 5:
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        nk = (qkv.shape[2] - num_heads_q) // 2
        q, k, v = qkv.split([num_heads_q, nk, nk], dim=2)
    q = reference_rotary(q, cos, sin, interleaved, offsets)
    k = reference_rotary(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k,
                         interleaved, offsets)
    if qkv.ndim == 5:
        return torch.stack([q, k, v.double()], dim=2)
    return torch.cat([q, k, v.double()], dim=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["packed", "gqa"])
@pytest.mark.parametrize("separate_k", [False, True])
@pytest.mark.parametrize("offset_kind", ["zero", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_matches_reference(dtype, layout, separate_k, offset_kind, interleaved):
    gen = _generator(11)
    batch, seqlen, headdim = 2, 5, 10
    num_heads_q = 4 if layout == "gqa" else None
    shape = (batch, seqlen, 3, 2, headdim) if layout == "packed" else (batch, seqlen, 8, headdim)
    qkv = _randn(gen, *shape, dtype=dtype)
    before = qkv.clone()
    cos, sin = _tables(gen, 8, 8, dtype)
    cos_k, sin_k = _tables(gen, 8, 8, dtype) if separate_k else (None, None)
    offsets = _offsets(offset_kind, batch, 8, seqlen, gen)
    out = apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved=interleaved,
                                seqlen_offsets=offsets, num_heads_q=num_heads_q)
    assert out is qkv
    expected = _expected_qkv(before, cos, sin, cos_k, sin_k, interleaved, offsets, num_heads_q)
    assert_rounded_from(out, expected)


@pytest.mark.parametrize("layout", ["packed", "gqa"])
def test_qkv_gradcheck(layout):
    gen = _generator(12)
    shape = (2, 4, 3, 2, 6) if layout == "packed" else (2, 4, 4, 6)
    qkv = _randn(gen, *shape, dtype=torch.float64).requires_grad_()
    cos, sin = _tables(gen, 6, 4, torch.float64)
    cos_k, sin_k = _tables(gen, 6, 4, torch.float64)
    offsets = torch.tensor([2, 0])
    num_heads_q = 2 if layout == "gqa" else None
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb_qkv_(t.clone(), cos, sin, cos_k, sin_k, interleaved=True,
                                        seqlen_offsets=offsets, num_heads_q=num_heads_q),
        (qkv,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_kv_matches_reference_and_gradients(dtype, interleaved):
    gen = _generator(13)
    kv = _randn(gen, 2, 6, 2, 3, 8, dtype=dtype)
    before = kv.clone()
    cos, sin = _tables(gen, 9, 6, dtype)
    out = apply_rotary_emb_kv_(kv, cos, sin, interleaved=interleaved, seqlen_offsets=3)
    assert out is kv
    assert_rounded_from(out[:, :, 0], reference_rotary(before[:, :, 0], cos, sin, interleaved, 3))
    assert torch.equal(out[:, :, 1], before[:, :, 1])

    kv64 = before.double().requires_grad_()
    offsets = torch.tensor([0, 3])
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb_kv_(t.clone(), cos.double(), sin.double(),
                                       interleaved=interleaved, seqlen_offsets=offsets),
        (kv64,))


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------


def _expected_tables(dim, base, seqlen, scale_base=None):
    """float64 cos/sin (q and k) of the RoPE / XPos formulas."""
    j = torch.arange(dim // 2, dtype=torch.float64)
    positions = torch.arange(seqlen, dtype=torch.float64)
    angles = positions[:, None] * base ** (-2 * j / dim)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if scale_base is None:
        return cos, sin, cos, sin
    decay = (2 * j + 0.4 * dim) / (1.4 * dim)
    scale = decay[None, :] ** ((positions[:, None] - seqlen // 2) / scale_base)
    return cos * scale, sin * scale, cos / scale, sin / scale


def test_rotary_embedding_tables_follow_the_formula():
    module = RotaryEmbedding(16, base=500.0)
    module._update_cos_sin_cache(40, device=torch.device("cpu"), dtype=torch.float32)
    cos, sin, _, _ = _expected_tables(16, 500.0, 40)
    assert module._cos_cached.shape == (40, 8) and module._cos_cached.dtype == torch.float32
    torch.testing.assert_close(module._cos_cached.double(), cos, atol=2e-5, rtol=0)
    torch.testing.assert_close(module._sin_cached.double(), sin, atol=2e-5, rtol=0)
    assert "inv_freq" not in module.state_dict()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("xpos", [False, True])
def test_rotary_embedding_packed_qkv(interleaved, xpos):
    gen = _generator(14)
    module = RotaryEmbedding(8, interleaved=interleaved, scale_base=64 if xpos else None)
    qkv = _randn(gen, 2, 5, 3, 2, 12)
    before = qkv.clone()
    out = module(qkv, seqlen_offset=3)
    assert out is qkv
    assert module._seq_len_cached == 8
    cos, sin, cos_k, sin_k = _expected_tables(8, 10000.0, 8, 64 if xpos else None)
    q = reference_rotary(before[:, :, 0], cos, sin, interleaved, 3)
    k = reference_rotary(before[:, :, 1], cos_k, sin_k, interleaved, 3)
    torch.testing.assert_close(out[:, :, 0].double(), q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 1].double(), k, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :, 2], before[:, :, 2])


def test_rotary_embedding_separate_kv_tensor_offsets_and_gqa():
    gen = _generator(15)
    module = RotaryEmbedding(6, scale_base=32)
    q, kv = _randn(gen, 2, 3, 4, 6), _randn(gen, 2, 3, 2, 2, 6)
    q_before, kv_before = q.clone(), kv.clone()
    offsets = torch.tensor([0, 7], dtype=torch.int32)
    q_out, kv_out = module(q, kv, seqlen_offset=offsets, max_seqlen=10)
    assert q_out is q and kv_out is kv
    cos, sin, cos_k, sin_k = _expected_tables(6, 10000.0, 10, 32)
    torch.testing.assert_close(q.double(), reference_rotary(q_before, cos, sin, False, offsets),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv[:, :, 0].double(),
                               reference_rotary(kv_before[:, :, 0], cos_k, sin_k, False, offsets),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(kv[:, :, 1], kv_before[:, :, 1])

    gqa = _randn(gen, 2, 3, 8, 6)
    gqa_before = gqa.clone()
    module = RotaryEmbedding(6)
    module(gqa, seqlen_offset=2, num_heads_q=4)
    cos, sin, _, _ = _expected_tables(6, 10000.0, 5)
    torch.testing.assert_close(gqa[:, :, :6].double(),
                               reference_rotary(gqa_before[:, :, :6], cos, sin, False, 2),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(gqa[:, :, 6:], gqa_before[:, :, 6:])


def test_rotary_embedding_cache_grows_and_follows_dtype():
    module = RotaryEmbedding(4)
    module(torch.zeros(1, 6, 3, 1, 4))
    assert module._seq_len_cached == 6
    module(torch.zeros(1, 2, 3, 1, 4))
    assert module._seq_len_cached == 6  # shorter input keeps the longer table
    module(torch.zeros(1, 2, 3, 1, 4, dtype=torch.bfloat16), seqlen_offset=7)
    assert module._seq_len_cached == 9 and module._cos_cached.dtype == torch.bfloat16


def test_rotary_embedding_pos_idx_in_fp32():
    exact = RotaryEmbedding(8)
    legacy = RotaryEmbedding(8, pos_idx_in_fp32=False)
    for module in (exact, legacy):
        module.inv_freq = module.inv_freq.to(torch.bfloat16)
        module._update_cos_sin_cache(2048, device=torch.device("cpu"), dtype=torch.float32)
    cos, _, _, _ = _expected_tables(8, 10000.0, 2048)
    # float32 positions recompute inv_freq in float32; bf16 positions round 1995 to 2000, etc.
    assert (exact._cos_cached.double() - cos).abs().max() < 1e-3
    assert (legacy._cos_cached.double() - cos).abs().max() > 0.1


def test_rotary_embedding_gradients_flow_through_the_module():
    gen = _generator(16)
    module = RotaryEmbedding(4)
    qkv = _randn(gen, 1, 3, 3, 1, 4, dtype=torch.float64).requires_grad_()
    module._update_cos_sin_cache(3, device=torch.device("cpu"), dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: module(t.clone()), (qkv,))


# ---------------------------------------------------------------------------------------------
# Rotary errors
# ---------------------------------------------------------------------------------------------


def _x_cos_sin():
    gen = _generator(17)
    return _randn(gen, 2, 4, 2, 8), *_tables(gen, 6, 8, torch.float32)


def test_rotary_dim_larger_than_headdim():
    x, _, _ = _x_cos_sin()
    cos = torch.ones(6, 5)
    with pytest.raises(ValueError, match=r"rotary_dim = 2 \* cos.shape\[1\] = 10 .*headdim = 8"):
        apply_rotary_emb(x, cos, cos)


def test_cos_sin_shape_mismatch():
    x, cos, sin = _x_cos_sin()
    with pytest.raises(ValueError, match=r"cos has shape \(6, 4\) but sin has shape \(5, 4\)"):
        apply_rotary_emb(x, cos, sin[:5])
    with pytest.raises(ValueError, match=r"cos must have shape \(seqlen_ro, rotary_dim / 2\)"):
        apply_rotary_emb(x, cos[None], sin)


def test_positions_past_the_table():
    x, cos, sin = _x_cos_sin()
    with pytest.raises(ValueError, match=r"seqlen_offsets \+ seqlen = 3 \+ 4 = 7 exceeds the 6"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=3)
    with pytest.raises(ValueError, match=r"seqlen_offsets\[1\] = 3 reaches position 6, past the 6"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"seqlen_offsets holds -1"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"seqlen_offsets must be >= 0, got -2"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=-2)
    with pytest.raises(ValueError, match=r"6 rows \(seqlen_ro\) but the sequences have up to 7"):
        apply_rotary_emb(torch.zeros(1, 7, 1, 8), cos, sin)


def test_bad_seqlen_offsets_tensor():
    x, cos, sin = _x_cos_sin()
    with pytest.raises(ValueError, match=r"shape \(batch,\) = \(2,\), got \(3,\)"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"int32 or int64, got torch.float32"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(2))
    with pytest.raises(TypeError, match=r"seqlen_offsets must be an int .* got float"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=1.5)


def test_bad_varlen_arguments():
    x, cos, sin = _x_cos_sin()
    rows = x.reshape(8, 2, 8)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"max_seqlen is None; it must be given with cu_seqlens"):
        apply_rotary_emb(rows, cos, sin, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"a sequence in cu_seqlens has 5 tokens, more than "
                                         r"max_seqlen = 4"):
        apply_rotary_emb(rows, cos, sin, cu_seqlens=cu, max_seqlen=4)
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] = 9 is past the 8 rows of x"):
        apply_rotary_emb(rows, cos, sin, cu_seqlens=torch.tensor([0, 9], dtype=torch.int32),
                         max_seqlen=6)
    with pytest.raises(ValueError, match=r"never decrease, got \[0, 5, 3\]"):
        apply_rotary_emb(rows, cos, sin, cu_seqlens=torch.tensor([0, 5, 3]), max_seqlen=5)
    with pytest.raises(ValueError, match=r"x must have shape \(total_seqlen, nheads, headdim\)"):
        apply_rotary_emb(x, cos, sin, cu_seqlens=cu, max_seqlen=5)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seqlen, nheads, headdim\)"):
        apply_rotary_emb(rows, cos, sin)


def test_bad_packed_layouts():
    _, cos, sin = _x_cos_sin()
    with pytest.raises(ValueError, match=r"num_heads_q is None; it is required for 4-D qkv"):
        apply_rotary_emb_qkv_(torch.zeros(1, 2, 6, 8), cos, sin)
    with pytest.raises(ValueError, match=r"num_heads_q = 3 does not split the 6 heads"):
        apply_rotary_emb_qkv_(torch.zeros(1, 2, 6, 8), cos, sin, num_heads_q=3)
    with pytest.raises(ValueError, match=r"5-D qkv must have shape \(batch, seqlen, 3, nheads, "
                                         r"headdim\), got \(1, 2, 2, 1, 8\)"):
        apply_rotary_emb_qkv_(torch.zeros(1, 2, 2, 1, 8), cos, sin)
    with pytest.raises(ValueError, match=r"kv must have shape \(batch, seqlen, 2, nheads, "
                                         r"headdim\), got \(1, 2, 3, 1, 8\)"):
        apply_rotary_emb_kv_(torch.zeros(1, 2, 3, 1, 8), cos, sin)
    with pytest.raises(ValueError, match=r"RotaryEmbedding: dim must be a positive even int, "
                                         r"got 7"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"seqlen_offset is a tensor and max_seqlen is None"):
        RotaryEmbedding(8)(torch.zeros(1, 2, 3, 1, 8), seqlen_offset=torch.tensor([0]))


def test_errors_leave_x_untouched():
    x, cos, sin = _x_cos_sin()
    before = x.clone()
    with pytest.raises(ValueError):
        apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=torch.tensor([0, 5]))
    assert torch.equal(x, before)


# ---------------------------------------------------------------------------------------------
# torch.compile (aot_eager: traces through dynamo and AOTAutograd without a C++ build)
# ---------------------------------------------------------------------------------------------


def test_rotary_under_torch_compile():
    gen = _generator(18)
    x = _randn(gen, 2, 5, 2, 8).requires_grad_()
    cos, sin = _tables(gen, 9, 6, torch.float32)
    offsets = torch.tensor([4, 1])
    compiled = torch.compile(apply_rotary_emb, backend="aot_eager", fullgraph=True)
    out = compiled(x, cos, sin, interleaved=True, seqlen_offsets=offsets)
    assert_rounded_from(out, reference_rotary(x.detach(), cos, sin, True, offsets))
    grad = _randn(gen, *out.shape)
    (grad_x,) = torch.autograd.grad(out, x, grad)
    assert_rounded_from(grad_x, reference_rotary(grad, cos, sin, True, offsets, conjugate=True))
    # Traced code cannot check tensor values; out-of-table positions stay unrotated there.
    late = compiled(x, cos, sin, interleaved=True, seqlen_offsets=torch.tensor([0, 7]))
    assert torch.equal(late[1, 2:], x[1, 2:])


def test_qkv_under_torch_compile():
    gen = _generator(19)
    qkv = _randn(gen, 2, 4, 3, 2, 8)
    cos, sin = _tables(gen, 4, 8, torch.float32)
    expected = _expected_qkv(qkv, cos, sin, None, None, False, 0, None)
    compiled = torch.compile(apply_rotary_emb_qkv_, backend="aot_eager")
    assert_rounded_from(compiled(qkv.clone(), cos, sin), expected)


# ---------------------------------------------------------------------------------------------
# bert_padding
# ---------------------------------------------------------------------------------------------


def reference_unpad(hidden, mask):
    rows, indices, seqlens = [], [], []
    batch, seqlen = mask.shape
    for b in range(batch):
        count = 0
        for s in range(seqlen):
            if mask[b, s]:
                rows.append(hidden[b, s])
                indices.append(b * seqlen + s)
                count += 1
        seqlens.append(count)
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    packed = torch.stack(rows) if rows else hidden.new_zeros((0, *hidden.shape[2:]))
    return packed, indices, cu, max(seqlens)


MASKS = {
    "right_padded": [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]],
    "holes": [[0, 1, 0, 1, 1], [1, 0, 0, 0, 1], [0, 0, 0, 0, 0]],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32])
@pytest.mark.parametrize("trailing", [(6,), (2, 3)])
def test_unpad_input_matches_reference(dtype, mask_name, mask_dtype, trailing):
    gen = _generator(20)
    mask = torch.tensor(MASKS[mask_name]).to(mask_dtype)
    hidden = _randn(gen, 3, 5, *trailing, dtype=dtype)
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(hidden, mask)
    ref_packed, ref_indices, ref_cu, ref_max = reference_unpad(hidden, mask)
    assert torch.equal(packed, ref_packed)
    assert indices.dtype == torch.int64 and indices.tolist() == ref_indices
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == ref_cu
    assert type(max_seqlen) is int and max_seqlen == ref_max
    assert used.dtype == torch.int32 and used.tolist() == [ref_cu[i + 1] - ref_cu[i]
                                                           for i in range(3)]
    padded = pad_input(packed, indices, 3, 5)
    assert padded.shape == hidden.shape and padded.dtype == dtype
    assert torch.equal(padded, hidden * mask.bool().reshape(3, 5, *([1] * len(trailing))))


def test_unpad_input_with_unused_mask():
    gen = _generator(21)
    hidden = _randn(gen, 2, 4, 3)
    attention = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 0]])
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(hidden, attention, unused)
    ref_packed, ref_indices, ref_cu, ref_max = reference_unpad(hidden, attention + unused)
    assert torch.equal(packed, ref_packed) and indices.tolist() == ref_indices
    assert cu_seqlens.tolist() == ref_cu == [0, 3, 6] and max_seqlen == ref_max == 3
    assert used.tolist() == [2, 1]


def test_unpad_input_all_padding():
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(
        torch.ones(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool))
    assert packed.shape == (0, 4) and indices.numel() == 0
    assert cu_seqlens.tolist() == [0, 0, 0] and max_seqlen == 0 and used.tolist() == [0, 0]


def test_unpad_for_concatenated_sequences_matches_reference():
    gen = _generator(22)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    hidden = _randn(gen, 3, 6, 4)
    packed, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(
        hidden, lengths)
    token_mask = torch.tensor([[1] * 5 + [0], [1] * 5 + [0], [1] * 6])
    ref_packed, ref_indices, _, _ = reference_unpad(hidden, token_mask)
    assert torch.equal(packed, ref_packed) and indices.tolist() == ref_indices
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16]
    assert type(max_seqlen) is int and max_seqlen == 6


def test_index_first_axis_forward_and_scatter_backward():
    gen = _generator(23)
    source = _randn(gen, 6, 2, 3, dtype=torch.float64).requires_grad_()
    indices = torch.tensor([4, 0, 5])
    out = index_first_axis(source, indices)
    assert torch.equal(out, torch.stack([source[4], source[0], source[5]]))
    grad = _randn(gen, 3, 2, 3, dtype=torch.float64)
    out.backward(grad)
    expected = torch.zeros(6, 2, 3, dtype=torch.float64)
    for row, index in enumerate(indices.tolist()):
        expected[index] = grad[row]
    assert torch.equal(source.grad, expected)
    assert index_first_axis == IndexFirstAxis.apply
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (source,))


def test_index_put_first_axis_and_pad_input_gradients():
    gen = _generator(24)
    values = _randn(gen, 3, 4, dtype=torch.float64).requires_grad_()
    indices = torch.tensor([5, 1, 2], dtype=torch.int32)
    out = index_put_first_axis(values, indices, 6)
    expected = torch.zeros(6, 4, dtype=torch.float64)
    for row, index in enumerate(indices.tolist()):
        expected[index] = values[row].detach()
    assert torch.equal(out.detach(), expected)
    assert index_put_first_axis == IndexPutFirstAxis.apply
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, indices, 6), (values,))
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, 2, 3), (values,))


def test_unpad_input_gradcheck_and_round_trip_gradient():
    gen = _generator(25)
    hidden = _randn(gen, 2, 4, 3, dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (hidden,))
    packed, indices, *_ = unpad_input(hidden, mask)
    pad_input(packed, indices, 2, 4).sum().backward()
    assert torch.equal(hidden.grad, mask[:, :, None].double().expand(2, 4, 3))


def test_index_first_axis_residual():
    gen = _generator(26)
    source = _randn(gen, 5, 3, dtype=torch.float64).requires_grad_()
    indices = torch.tensor([3, 1])
    rows, residual = index_first_axis_residual(source, indices)
    assert torch.equal(rows, source[indices]) and torch.equal(residual, source)
    assert index_first_axis_residual == IndexFirstAxisResidual.apply
    grad_rows = _randn(gen, 2, 3, dtype=torch.float64)
    grad_residual = _randn(gen, 5, 3, dtype=torch.float64)
    torch.autograd.backward([rows, residual], [grad_rows, grad_residual])
    expected = grad_residual.clone()
    expected[3] += grad_rows[0]
    expected[1] += grad_rows[1]
    assert torch.equal(source.grad, expected)
    assert torch.autograd.gradcheck(lambda t: index_first_axis_residual(t, indices), (source,))


def test_padding_under_torch_compile():
    gen = _generator(27)
    hidden = _randn(gen, 2, 5, 3).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)

    def double_tokens(h, m):
        packed, indices, _, _, _ = unpad_input(h, m)
        return pad_input(packed * 2, indices, h.shape[0], h.shape[1])

    out = torch.compile(double_tokens, backend="aot_eager")(hidden, mask)
    assert torch.equal(out, 2 * hidden.detach() * mask[:, :, None])
    out.sum().backward()
    assert torch.equal(hidden.grad, 2.0 * mask[:, :, None].float().expand(2, 5, 3))


def test_padding_errors():
    hidden = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, seqlen\) = "
                                         r"\(2, 3\) to match hidden_states, got \(2, 4\)"):
        unpad_input(hidden, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"attention_mask holds 2; only 0 \(padding\) and 1"):
        unpad_input(hidden, torch.tensor([[1, 2, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"unused_mask holds -1"):
        unpad_input(hidden, torch.ones(2, 3), torch.tensor([[0, 0, -1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"hidden_states must have shape \(batch, seqlen, \.\.\.\) "
                                         r"\(at least 3 dimensions\), got shape \(2, 3\)"):
        unpad_input(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"indices holds 6, outside the first axis \[0, 6\)"):
        pad_input(torch.zeros(2, 4), torch.tensor([0, 6]), 2, 3)
    with pytest.raises(TypeError, match=r"indices must have dtype int32 or int64, got "
                                        r"torch.float32"):
        index_first_axis(hidden, torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"indices has 3 entries but values has 2 rows"):
        index_put_first_axis(torch.zeros(2, 4), torch.tensor([0, 1, 2]), 6)
    with pytest.raises(ValueError, match=r"pad_input: batch must be an int >= 0, got -1"):
        pad_input(torch.zeros(2, 4), torch.tensor([0, 1]), -1, 3)
    with pytest.raises(ValueError, match=r"input must have shape \(first_axis_dim, \.\.\.\)"):
        index_first_axis(torch.zeros(4), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"adds up to 4 tokens, more than seqlen = 3"):
        unpad_input_for_concatenated_sequences(hidden, torch.tensor([[2, 2, 0], [1, 0, 0]]))
    with pytest.raises(TypeError, match=r"attention_mask_in_length must hold integer lengths"):
        unpad_input_for_concatenated_sequences(hidden, torch.ones(2, 3, dtype=torch.bool))
