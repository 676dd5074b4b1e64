"""transformers' generate with an 8-bit KV cache through anyattn (KV8Cache), against the bfloat16
cache of the same model.

Tiny randomly initialised bfloat16 models (no downloads) generate greedily from a left-padded
batch of two prompts with ``cache=KV8Cache(dtype)`` (generate's cache argument) and with transformers' default
(bfloat16) cache. The first step's logits must be as close to the bfloat16 run as the 8-bit
rounding of the keys and values explains: at most twice the deviation of a run whose cache holds
the same keys/values rounded through anyattn.quantize_kv_cache and back (computed in torch), plus
the bfloat16 rounding of the logits. Tokens are not required to agree (rounding flips near-ties);
the agreement rate is printed (pytest -s).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import anyattn  # noqa: E402
from anyattn.integrations import transformers as anyattn_hf  # noqa: E402
from anyattn.integrations.transformers_kv8 import KV8Cache  # noqa: E402
from transformers.cache_utils import Cache, DynamicLayer  # noqa: E402

VOCAB = 101
PROMPT, NEW = 9, 12


def _model(kind):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, initializer_range=0.2)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
    else:  # softcap and a sliding window reach the cache call
        config = transformers.Gemma2Config(attn_logit_softcapping=3.0, sliding_window=6,
                                           final_logit_softcapping=None, query_pre_attn_scalar=16,
                                           layer_types=["sliding_attention", "full_attention"],
                                           **common)
    anyattn_hf.register()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="anyattn")
    return model.to(torch.bfloat16).eval()


class _RoundTripLayer(DynamicLayer):
    """A bfloat16 cache layer holding keys/values rounded through the 8-bit format and back."""

    cache_dtype = None

    def update(self, key_states, value_states, *args, **kwargs):
        def round_trip(x):
            stored, _, token = anyattn.quantize_kv_cache(x.transpose(1, 2).float(),
                                                         self.cache_dtype, "token")
            return anyattn.dequantize_kv_cache(stored, None, token, x.dtype).transpose(1, 2)

        return super().update(round_trip(key_states), round_trip(value_states), *args, **kwargs)


def _generate(model, ids, mask, cache):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=NEW,
                             min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences, out.logits[0].float()


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_generate_with_an_8bit_cache_tracks_the_bf16_cache(kind, cache_dtype):
    model = _model(kind)
    ids = torch.randint(1, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: the cache call's cache_leftpad

    tokens_bf16, logits_bf16 = _generate(model, ids, mask, None)
    cache = KV8Cache(cache_dtype, initial_capacity=8)  # grows (doubles) during generation
    tokens_8bit, logits_8bit = _generate(model, ids, mask, cache)
    round_trip = type("RoundTrip", (_RoundTripLayer,), {"cache_dtype": cache_dtype})
    _, logits_round_trip = _generate(model, ids, mask, Cache(layer_class_to_replicate=round_trip))

    assert tokens_8bit.shape == (2, PROMPT + NEW)
    assert torch.equal(tokens_8bit[:, :PROMPT], ids)
    assert cache.get_seq_length() == PROMPT + NEW - 1  # the last token is never fed back
    assert all(layer.k8.dtype == cache_dtype for layer in cache.layers)
    new_8bit, new_bf16 = tokens_8bit[:, PROMPT:], tokens_bf16[:, PROMPT:]
    agreement = (new_8bit == new_bf16).float().mean().item()
    print(f"\n{kind} {cache_dtype}: token agreement with the bf16 cache {agreement:.3f} "
          f"({int((new_8bit == new_bf16).sum())}/{new_8bit.numel()})")

    deviation = (logits_8bit - logits_bf16).abs().max().item()
    explained = (logits_round_trip - logits_bf16).abs().max().item()
    bf16_ulp = 2.0 ** -8 * logits_bf16.abs().max().item()
    print(f"{kind} {cache_dtype}: first-step logits max |8-bit - bf16| {deviation:.4g}, "
          f"8-bit rounding alone {explained:.4g}")
    assert deviation <= 2 * explained + 2 * bf16_ulp


def test_a_kv8_cache_without_anyattn_attention_fails_loudly():
    model = _model("llama")
    model.set_attn_implementation("eager")
    ids = torch.randint(1, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    try:
        with pytest.raises((RuntimeError, TypeError)):
            with torch.no_grad():
                model.generate(ids, cache=KV8Cache(torch.int8), max_new_tokens=2,
                               do_sample=False, pad_token_id=0)
    finally:
        model.set_attn_implementation("anyattn")
