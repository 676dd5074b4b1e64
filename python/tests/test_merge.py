"""merge_attention_states: two halves of a key range merge into the whole; -inf; in place."""

from __future__ import annotations

import numpy as np
import pytest

import anyattn
from conftest import FRAMEWORK_DTYPES, make_inputs, to_numpy


@pytest.mark.parametrize("framework,dtype", FRAMEWORK_DTYPES)
def test_two_halves_equal_the_whole(framework, dtype):
    (q, k, v), _ = make_inputs(framework, dtype, [(2, 5, 4, 16), (2, 12, 2, 16), (2, 12, 2, 16)], 1)
    if framework == "numpy":
        q, k, v = (x.astype(np.float32) for x in (q, k, v))
    else:
        q, k, v = (x.float() for x in (q, k, v))
    whole, lse = anyattn.flash_attn_func(q, k, v, return_attn_probs=True)[:2]
    oa, la = anyattn.flash_attn_func(q, k[:, :7], v[:, :7], return_attn_probs=True)[:2]
    ob, lb = anyattn.flash_attn_func(q, k[:, 7:], v[:, 7:], return_attn_probs=True)[:2]
    out, lse_m = anyattn.merge_attention_states(oa, la, ob, lb)
    np.testing.assert_allclose(to_numpy(out), to_numpy(whole), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(lse_m), to_numpy(lse), rtol=1e-5, atol=1e-5)
    # 3-D form, in place.
    oa3, la3 = oa[0], la[0]
    res = anyattn.merge_attention_states_(oa3, la3, ob[0], lb[0])
    assert res[0] is oa3
    np.testing.assert_allclose(to_numpy(oa3), to_numpy(whole[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(la3), to_numpy(lse[0]), rtol=1e-5, atol=1e-5)


def test_minus_inf_sides():
    rng = np.random.default_rng(0)
    oa = rng.standard_normal((3, 2, 4)).astype(np.float32)
    ob = rng.standard_normal((3, 2, 4)).astype(np.float32)
    la = np.array([[-np.inf, 0.5, -np.inf], [1.0, 2.0, 3.0]], np.float32)
    lb = np.array([[0.0, -np.inf, -np.inf], [1.0, 2.0, 3.0]], np.float32)
    oa[0, 0] = np.nan  # an empty side's row is ignored
    out, lse = anyattn.merge_attention_states(oa, la, ob, lb)
    np.testing.assert_array_equal(out[0, 0], ob[0, 0])
    np.testing.assert_array_equal(out[1, 0], oa[1, 0])
    np.testing.assert_array_equal(out[2, 0], 0)
    assert lse[0, 2] == -np.inf and lse[0, 0] == 0.0
    np.testing.assert_allclose(lse[1], la[1] + np.log(2), rtol=1e-6)


def test_torch_ops_trace_and_mismatch_raises():
    torch = pytest.importorskip("torch")
    schema = torch.ops.anyattn.merge_attention_states_.default._schema
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == ["out_a", "lse_a"]

    @torch.compile(backend="eager", fullgraph=True)
    def merged(oa, la, ob, lb):
        return anyattn.merge_attention_states(oa, la, ob, lb)

    oa, ob = torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8)
    la, lb = torch.randn(2, 2, 3), torch.randn(2, 2, 3)
    out, lse = merged(oa, la, ob, lb)
    assert torch.allclose(lse, torch.logaddexp(la, lb), atol=1e-6)
    with pytest.raises(ValueError, match="out_b.shape"):
        anyattn.merge_attention_states(oa, la, ob[:, :2], lb)
