"""Strided views, packed qkv/kv and copies: results must equal the contiguous call bit for bit
(the kernel's arithmetic does not depend on strides), and packed forms must not copy."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from anyattn import _tensors
from conftest import make_inputs


def _contiguous_result(q, k, v, **kw):
    return anyattn.flash_attn_func(np.ascontiguousarray(q), np.ascontiguousarray(k),
                                   np.ascontiguousarray(v), **kw)


def test_numpy_views_equal_contiguous_bitwise():
    (big,), _ = make_inputs("numpy", "float32", [(2, 4, 50, 64)], 11)  # (B, H, S, D) storage
    q = big.transpose(0, 2, 1, 3)[:, 3:40]           # (B, S, H, D) with a head-major stride
    k = big.transpose(0, 2, 1, 3)[:, ::-1][:, :45, :2]  # negative sequence stride
    v = np.broadcast_to(big[:1, :2, :45].transpose(0, 2, 1, 3), (2, 45, 2, 64))  # batch stride 0
    got = anyattn.flash_attn_func(q, k, v, causal=True)
    np.testing.assert_array_equal(got, _contiguous_result(q, k, v, causal=True))


def test_numpy_non_unit_last_stride_is_copied_and_correct():
    (q, k, v2), _ = make_inputs("numpy", "float16", [(1, 9, 2, 16), (1, 12, 2, 16), (1, 12, 2, 32)], 5)
    v = v2[..., ::2]  # last-dim stride 2: the one layout that needs a copy
    got = anyattn.flash_attn_func(q, k, v)
    np.testing.assert_array_equal(got, _contiguous_result(q, k, v))


def test_packed_forms_are_views_not_copies(monkeypatch):
    (qkv, kv, q), _ = make_inputs("numpy", "float32", [(2, 33, 3, 4, 32), (2, 40, 2, 2, 32), (2, 33, 4, 32)], 6)
    seen = []
    original = _tensors.numpy_spec

    def spy(a, code):
        spec, kept = original(a, code)
        seen.append(kept is a)
        return spec, kept

    monkeypatch.setattr("anyattn._cpu.numpy_spec", spy)
    packed = anyattn.flash_attn_qkvpacked_func(qkv, causal=True)
    kvp = anyattn.flash_attn_kvpacked_func(q, kv, window_size=(5, 5))
    assert seen and all(seen), "a packed view was copied"
    monkeypatch.undo()
    np.testing.assert_array_equal(
        packed, _contiguous_result(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True))
    np.testing.assert_array_equal(
        kvp, _contiguous_result(q, kv[:, :, 0], kv[:, :, 1], window_size=(5, 5)))


def test_torch_views_and_packed_equal_contiguous_bitwise():
    torch = pytest.importorskip("torch")
    (bhsd, qkv), _ = make_inputs("torch", "bfloat16", [(2, 4, 30, 48), (2, 30, 3, 4, 48)], 8)
    q = bhsd.transpose(1, 2)  # strided (B, S, H, D) view
    k, v = qkv[:, :, 1], qkv[:, :, 2]
    got = anyattn.flash_attn_func(q, k, v, softcap=4.0)
    want = anyattn.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), softcap=4.0)
    assert torch.equal(got, want)
    packed = anyattn.flash_attn_qkvpacked_func(qkv, return_attn_probs=True)
    unpacked = anyattn.flash_attn_func(*(qkv[:, :, i].contiguous() for i in range(3)),
                                       return_attn_probs=True)
    assert torch.equal(packed[0], unpacked[0]) and torch.equal(packed[1], unpacked[1])
    assert packed[2].shape == (0,) and packed[2].dtype == qkv.dtype  # flash-attn: empty S_dmask
    strided_last = anyattn.flash_attn_func(q, k, v[..., ::1].transpose(-1, -2).contiguous().transpose(-1, -2))
    assert torch.equal(strided_last, anyattn.flash_attn_func(q, k, v))


def test_empty_sequences():
    (q, k, v), _ = make_inputs("numpy", "float32", [(1, 0, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8)], 9)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == (1, 0, 2, 8) and lse.shape == (1, 2, 0)
    (q, k, v), _ = make_inputs("numpy", "float32", [(1, 3, 2, 8), (1, 0, 2, 8), (1, 0, 2, 8)], 9)
    out, lse, _ = anyattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
