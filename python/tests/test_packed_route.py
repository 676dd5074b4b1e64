"""The off-CPU route for packed sequences (anyattn._packed_route), run on CPU tensors so that CI
checks it against anyattn's varlen kernel: one attention under a block-diagonal mask, through SDPA
when it can express the call and no LSE is wanted, else the f32 math path; and the pure choice
between those and the flash_attn package."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn import _dispatch  # noqa: E402
from anyattn._options import make_options  # noqa: E402
from anyattn._packed_route import packed_attention, packed_layout  # noqa: E402

LENS_Q = [3, 0, 7, 1, 5]
LENS_K = [6, 4, 7, 9, 2]


def _cu(lengths, extra=0):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def _case(dtype, hq=4, hk=2, d=16, spare_q_rows=2):
    """Packed q/k/v with ``spare_q_rows`` rows after the last sequence (outside every one)."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(LENS_Q) + spare_q_rows, hq, d, generator=g).to(dtype)
    k = torch.randn(sum(LENS_K), hk, d, generator=g).to(dtype)
    v = torch.randn(sum(LENS_K), hk, d, generator=g).to(dtype)
    return q, k, v, _cu(LENS_Q), _cu(LENS_K)


FEATURES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(2, 1)),
    "softcap_alibi_sinks": dict(softcap=3.0, alibi=True, sinks=True, causal=True),
    "seqused_k": dict(causal=True, seqused=True),
}


@pytest.mark.parametrize("want_lse", [False, True])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_packed_attention_equals_the_varlen_kernel(feature, want_lse):
    spec = FEATURES[feature]
    q, k, v, cu_q, cu_k = _case(torch.float32)
    options = make_options(0.0, None, spec.get("causal", False), spec.get("window_size", (-1, -1)),
                           spec.get("softcap", 0.0), False)
    alibi = torch.rand(len(LENS_Q), q.shape[1]) if spec.get("alibi") else None
    sinks = torch.randn(q.shape[1]) if spec.get("sinks") else None
    used = torch.tensor([min(n, 3) for n in LENS_K], dtype=torch.int32) if spec.get("seqused") else None
    layout = packed_layout(cu_q, cu_k, used, q.shape[0], k.shape[0], q.device)
    out, lse = packed_attention(q, k, v, layout, options, alibi, sinks, want_lse)
    ref, ref_lse, _ = anyattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=options.causal,
        window_size=options.window_size, softcap=options.softcap, alibi_slopes=alibi,
        sinks=sinks, seqused_k=used, return_attn_probs=True)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    assert not out[sum(LENS_Q):].any()  # rows outside every sequence stay 0
    if lse is not None:
        torch.testing.assert_close(lse, ref_lse, rtol=2e-5, atol=2e-5)
    else:  # only the SDPA branch returns no LSE, and only for calls it can express exactly
        assert not want_lse and options.softcap == 0.0 and alibi is None and sinks is None


def test_packed_attention_in_bfloat16_through_sdpa():
    q, k, v, cu_q, cu_k = _case(torch.bfloat16)
    options = make_options(0.0, None, True, (-1, -1), 0.0, False)
    layout = packed_layout(cu_q, cu_k, None, q.shape[0], k.shape[0], q.device)
    out, lse = packed_attention(q, k, v, layout, options, None, None, False)
    assert lse is None and out.dtype == torch.bfloat16
    ref = anyattn.flash_attn_varlen_func(q.float(), k.float(), v.float(), cu_q, cu_k,
                                         max(LENS_Q), max(LENS_K), causal=True)
    assert float((out.float() - ref).abs().max()) < 2e-2


def test_no_sequences_gives_zeros():
    q, k, v, _, _ = _case(torch.float32)
    empty = torch.zeros(1, dtype=torch.int32)
    layout = packed_layout(empty, empty, None, q.shape[0], k.shape[0], q.device)
    out, lse = packed_attention(q, k, v, layout, make_options(0.0, None, False, (-1, -1), 0.0, False),
                                None, None, True)
    assert not out.any() and torch.isneginf(lse).all()


@pytest.mark.parametrize("seqused_k, version, expected", [
    (False, "2.8.3", _dispatch.FLASH_ATTN),
    (True, "2.8.3", _dispatch.SDPA),
    (False, None, _dispatch.SDPA),
])
def test_varlen_route_choice_is_pure(seqused_k, version, expected):
    call = _dispatch.CallFeatures(dtype="bfloat16", head_dim=64, head_dim_v=64, seqused_k=seqused_k)
    env = _dispatch.Environment(flash_attn_version=version, cuda_capability=(9, 0))
    choice = _dispatch.select_backend("cuda", call, env)
    assert choice.backend == expected
    if seqused_k:
        assert "seqused_k" in choice.reason
