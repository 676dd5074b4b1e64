"""Integrations: transformers (real library, tiny random models built from configs, no downloads)
and sglang's vision-attention backend contract (sglang itself is not installed: the test calls the
class exactly as sglang's VisionAttention does, with each cu_seqlens form it passes)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anyattn  # noqa: E402
from anyattn.integrations.sglang import VisionAnyAttention  # noqa: E402
from conftest import to_numpy  # noqa: E402
from reference import attention_ref  # noqa: E402


def _tiny_model(transformers, kind, attn_implementation):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
    else:
        config = transformers.MistralConfig(sliding_window=5, **common)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", "mistral_sliding_window"])
@pytest.mark.parametrize("padding", [False, True])
def test_transformers_logits_match_eager(kind, padding, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from anyattn.integrations import transformers as anyattn_hf

    anyattn_hf.register()
    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs.get("window_size"))
        return anyattn.flash_attn_func(*args, **kwargs)

    monkeypatch.setattr(anyattn_hf, "flash_attn_func", counting)
    eager = _tiny_model(transformers, kind, "eager")
    ours = _tiny_model(transformers, kind, "anyattn")
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padding:
        mask[0, :4] = 0  # left padding
        mask[2, :1] = 0
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=2e-5, atol=2e-5)
    assert calls, "the anyattn attention function was not called"
    assert all(w == ((4, 4) if kind != "llama" else (-1, -1)) for w in calls), calls


def test_transformers_generate_with_padding_matches_eager():
    transformers = pytest.importorskip("transformers")
    from anyattn.integrations import transformers as anyattn_hf

    anyattn_hf.register()
    eager = _tiny_model(transformers, "llama", "eager")
    ours = _tiny_model(transformers, "llama", "anyattn")
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(1, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), eager.generate(ids, **kw))


class _SingletonCache:
    """sglang's SingletonCache interface: empty(), get_data(), set_data()."""

    def __init__(self):
        self.data = None

    def empty(self):
        return self.data is None

    def get_data(self):
        return self.data

    def set_data(self, value):
        self.data = value


def _per_sequence_reference(q, k, v, bounds, **kw):
    outs = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        o, _ = attention_ref(to_numpy(q[s:e])[None], to_numpy(k[s:e])[None], to_numpy(v[s:e])[None], **kw)
        outs.append(o[0])
    return np.concatenate(outs)


def test_sglang_vision_backend_honours_window_sinks_and_scale():
    g = torch.Generator().manual_seed(4)
    bounds = [0, 7, 20, 21, 36]
    q = torch.randn(36, 4, 32, generator=g)
    k = torch.randn(36, 2, 32, generator=g)
    v = torch.randn(36, 2, 32, generator=g)
    s_aux = torch.tensor([0.3, -0.7, 1.1, 0.0], dtype=torch.bfloat16)
    backend = VisionAnyAttention(num_heads=4, head_dim=32)
    out = backend(q, k, v, torch.tensor(bounds, dtype=torch.int32), bsz=4, seq_len=9,
                  softmax_scale=0.2, window_size=(3, 2), s_aux=s_aux)
    assert tuple(out.shape) == (36, 4, 32)
    want = _per_sequence_reference(q, k, v, bounds, softmax_scale=0.2, window=(3, 2),
                                   sinks=s_aux.float().numpy())
    np.testing.assert_allclose(to_numpy(out), want, rtol=1e-5, atol=1e-5)
    plain = backend(q, k, v, torch.tensor(bounds), bsz=4, seq_len=9)
    assert not torch.allclose(plain, out), "window_size/s_aux/softmax_scale had no effect"


def test_sglang_vision_backend_accepts_every_cu_seqlens_form():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2 * 6, 2, 16, generator=g) for _ in range(3))
    backend = VisionAnyAttention()
    uniform = backend(q, k, v, torch.tensor([0, 6, 12]), bsz=2, seq_len=6)
    cache = _SingletonCache()
    assert torch.equal(backend(q, k, v, None, bsz=2, seq_len=6), uniform)
    assert torch.equal(backend(q, k, v, cache, bsz=2, seq_len=6), uniform)
    assert cache.get_data().tolist() == [0, 6, 12]
    assert torch.equal(backend(q, k, v, [torch.tensor([0, 6, 12]), 6], bsz=2, seq_len=6), uniform)

    class Meta:
        cu_seqlens = torch.tensor([0, 6, 12])

    assert torch.equal(backend(q, k, v, None, bsz=2, seq_len=6, forward_metadata=Meta()), uniform)
    batched = backend(q.view(2, 6, 2, 16), k.view(2, 6, 2, 16), v.view(2, 6, 2, 16), None, bsz=2, seq_len=6)
    assert torch.equal(batched.reshape(12, 2, 16), uniform)
    with pytest.raises(ValueError, match="cu_seqlens"):
        backend(q, k, v, torch.tensor([0, 5, 11]), bsz=2, seq_len=6)
    want = _per_sequence_reference(q, k, v, [0, 6, 12])
    np.testing.assert_allclose(to_numpy(uniform), want, rtol=1e-5, atol=1e-5)
    assert anyattn.flash_attn_func(q[None, :6], k[None, :6], v[None, :6])[0].shape == (6, 2, 16)
