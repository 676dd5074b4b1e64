"""attn_implementation="anyattn" in real transformers models, checked against "eager".

Tiny models are built from configs with random weights (no downloads): Llama, Gemma 2 (logit
softcapping, sliding window), gpt-oss (sinks, sliding window) and the Qwen2.5-VL vision tower
(cu_seqlens over images of different sizes, windowed and full attention blocks). Everything runs in
float32 through the models' own forward / generate / loss; the comparisons cover dense, left- and
right-padded, packed (padding-free) batches, custom 4-D masks, greedy generation and a
padding-free training step.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from anyattn.integrations import transformers as anyattn_hf  # noqa: E402
from anyattn.integrations import transformers_masks, transformers_varlen  # noqa: E402

VOCAB = 101
TOL = dict(rtol=1e-5, atol=1e-5)  # float32 forward
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)  # float32 gradients


def _config(kind):
    # initializer_range: weights large enough for peaked attention, so that softcap, windows and
    # sinks change the result.
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, initializer_range=0.2)
    alternating = ["sliding_attention", "full_attention"]
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "gemma2":
        return transformers.Gemma2Config(attn_logit_softcapping=3.0, final_logit_softcapping=None,
                                         sliding_window=4, query_pre_attn_scalar=12,
                                         layer_types=alternating, **common)
    if kind == "gpt_oss":
        return transformers.GptOssConfig(num_local_experts=4, num_experts_per_tok=2,
                                         sliding_window=4, layer_types=alternating, **common)
    raise ValueError(kind)


CAUSAL_LMS = ["llama", "gemma2", "gpt_oss"]
_MODELS = {}


def _models(kind):
    """(anyattn model, eager model) with identical random weights, in eval mode."""
    if kind not in _MODELS:
        anyattn_hf.register()
        torch.manual_seed(0)
        build = transformers.AutoModelForCausalLM.from_config
        eager = build(_config(kind), attn_implementation="eager")
        ours = build(_config(kind), attn_implementation="anyattn")
        ours.load_state_dict(eager.state_dict())
        if kind == "gpt_oss":  # sinks must matter: make them large enough to change the softmax
            for a, b in zip(ours.model.layers, eager.model.layers):
                sinks = torch.linspace(-1.0, 2.0, a.self_attn.sinks.numel())
                a.self_attn.sinks.data.copy_(sinks)
                b.self_attn.sinks.data.copy_(sinks)
        _MODELS[kind] = (ours.eval(), eager.eval())
    return _MODELS[kind]


def _ids(*shape, seed=1):
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


class _Spy:
    """Counts anyattn's varlen calls made by the integration and records their cu_seqlens_q."""

    def __init__(self, monkeypatch):
        self.cu_seqlens = []
        real = transformers_varlen.flash_attn_varlen_func

        def spy(q, k, v, cu_seqlens_q, *args, **kwargs):
            self.cu_seqlens.append(cu_seqlens_q.tolist())
            return real(q, k, v, cu_seqlens_q, *args, **kwargs)

        monkeypatch.setattr(transformers_varlen, "flash_attn_varlen_func", spy)


def _pack(sequences):
    """input_ids and position_ids of sequences packed into one row."""
    input_ids = torch.cat(sequences).unsqueeze(0)
    position_ids = torch.cat([torch.arange(len(s)) for s in sequences]).unsqueeze(0)
    return input_ids, position_ids


def _flatten(sequences, return_flash_attn_kwargs, return_position_ids=True):
    """transformers' own padding-free collator over the sequences: input_ids, labels (-100 on each
    sequence's first token), optionally position_ids and cu_seq_lens_q/k, max_length_q/k."""
    collator = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=return_flash_attn_kwargs, return_position_ids=return_position_ids)
    return collator([{"input_ids": s.tolist()} for s in sequences], return_tensors="pt")


@pytest.mark.parametrize("kind", CAUSAL_LMS)
def test_dense_batch_matches_eager(kind):
    ours, eager = _models(kind)
    ids = _ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, eager(input_ids=ids).logits, **TOL)


@pytest.mark.parametrize("kind", CAUSAL_LMS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_is_one_varlen_call_per_layer_and_matches_eager(kind, side, monkeypatch):
    ours, eager = _models(kind)
    ids = _ids(3, 10, seed=2)
    mask = torch.ones_like(ids)
    pads = {0: 4, 2: 1}
    for row, n in pads.items():
        if side == "left":
            mask[row, :n] = 0
        else:
            mask[row, -n:] = 0
    spy = _Spy(monkeypatch)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], **TOL)
    # One varlen call per layer over the three sequences' real tokens: no loop over the batch.
    assert spy.cu_seqlens == [[0, 6, 16, 25]] * ours.config.num_hidden_layers


@pytest.mark.parametrize("kind", CAUSAL_LMS)
@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
def test_packed_sequences_match_each_sequence_alone(kind, boundaries, monkeypatch):
    ours, eager = _models(kind)
    lengths = [5, 9, 7]
    sequences = [_ids(n, seed=10 + i) for i, n in enumerate(lengths)]
    # With cu_seq_lens the collator leaves out position_ids: the model then numbers the packed row
    # 0..20 and only the boundaries keep the sequences apart.
    with_boundaries = boundaries == "cu_seq_lens"
    batch = _flatten(sequences, return_flash_attn_kwargs=with_boundaries,
                     return_position_ids=not with_boundaries)
    batch.pop("labels")
    positions = batch["position_ids"][0] if "position_ids" in batch else torch.arange(sum(lengths))
    spy = _Spy(monkeypatch)
    with torch.no_grad():
        packed = ours(**batch).logits[0]
    assert spy.cu_seqlens == [[0, 5, 14, 21]] * ours.config.num_hidden_layers
    start = 0
    with torch.no_grad():
        for seq in sequences:
            alone_inputs = dict(input_ids=seq.unsqueeze(0),
                                position_ids=positions[start:start + len(seq)].unsqueeze(0))
            alone = ours(**alone_inputs).logits[0]
            reference = eager(**alone_inputs).logits[0]
            piece = packed[start:start + len(seq)]
            torch.testing.assert_close(piece, alone, **TOL)
            torch.testing.assert_close(piece, reference, **TOL)
            start += len(seq)


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_packed_rows_in_a_batch_of_two_match_each_sequence_alone(kind, monkeypatch):
    # transformers' flash path only unpacks a single row; for two packed rows the anyattn mask
    # function hands the attention an exact 4-D mask instead of letting sequences see each other.
    # (transformers looks for packing in position_ids only without a cache, hence use_cache=False.)
    ours, eager = _models(kind)
    monkeypatch.setattr(transformers_masks, "_warned_dense_mask", True)
    rows = [[_ids(4, seed=20), _ids(6, seed=21)], [_ids(7, seed=22), _ids(3, seed=23)]]
    packed = [_pack(row) for row in rows]
    input_ids = torch.cat([ids for ids, _ in packed])
    position_ids = torch.cat([positions for _, positions in packed])
    with torch.no_grad():
        got = ours(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        for r, row in enumerate(rows):
            start = 0
            for seq in row:
                alone = eager(input_ids=seq.unsqueeze(0), use_cache=False).logits[0]
                torch.testing.assert_close(got[r, start:start + len(seq)], alone, **TOL)
                start += len(seq)


@pytest.mark.parametrize("kind", CAUSAL_LMS)
def test_greedy_generate_is_token_identical_to_eager(kind):
    ours, eager = _models(kind)
    ids = _ids(2, 7, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as generate expects
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), eager.generate(ids, **kw))


@pytest.mark.parametrize("kind", CAUSAL_LMS)
@pytest.mark.parametrize("padded", [False, True])
def test_greedy_generate_with_a_static_cache_is_token_identical_to_eager(kind, padded, monkeypatch):
    # The prompt is shorter than the sliding window (4) and generation runs past it, so the static
    # cache is seen both with unwritten slots and full. The varlen path serves all of it, as it
    # does for flash-attention: the exact dense-mask path is never needed.
    ours, eager = _models(kind)

    def no_dense_path(*args, **kwargs):
        raise AssertionError("a static cache took the dense-mask path")

    monkeypatch.setattr(anyattn_hf, "masked_attention", no_dense_path)
    ids = _ids(2, 3, seed=4)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :1] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
              cache_implementation="static")
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), eager.generate(ids, **kw))


def _loss_and_grads(model, **inputs):
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("kind", CAUSAL_LMS)
@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
def test_padding_free_training_step_equals_the_per_sequence_run(kind, boundaries):
    ours, eager = _models(kind)
    lengths = [6, 9, 4]
    sequences = [_ids(n, seed=30 + i) for i, n in enumerate(lengths)]
    batch = _flatten(sequences, return_flash_attn_kwargs=boundaries == "cu_seq_lens")
    ours.train()
    eager.train()
    try:
        loss, grads = _loss_and_grads(ours, **batch)
        # The collator's labels leave each sequence's first token unpredicted, so the packed loss
        # is the mean over every sequence's (length - 1) predicted tokens: the per-sequence mean
        # losses weighted by their token counts.
        predicted = sum(n - 1 for n in lengths)
        eager.zero_grad()
        want_loss = 0.0
        for seq in sequences:
            one = eager(input_ids=seq.unsqueeze(0), labels=seq.unsqueeze(0)).loss
            one = one * ((len(seq) - 1) / predicted)
            one.backward()
            want_loss = want_loss + one.detach()
        want_grads = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
    finally:
        ours.eval()
        eager.eval()
        ours.zero_grad()
        eager.zero_grad()
    torch.testing.assert_close(loss, want_loss, **TOL)
    assert grads.keys() == want_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], **GRAD_TOL,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("padded", [False, True])
def test_attention_dropout_reaches_the_varlen_kernel_in_training(padded):
    # Dropout is random, so eager cannot be the reference: check that training applies it (the
    # output moves away from eval mode's) and that it follows torch's seed.
    anyattn_hf.register()
    config = _config("llama")
    config.attention_dropout = 0.5
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="anyattn")
    if padded:
        ids = _ids(2, 9, seed=11)
        inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
        inputs["attention_mask"][1, :3] = 0
    else:
        inputs = _flatten([_ids(5, seed=12), _ids(8, seed=13)], return_flash_attn_kwargs=False)
        inputs.pop("labels")
    with torch.no_grad():
        model.eval()
        plain = model(**inputs).logits
        model.train()
        torch.manual_seed(3)
        dropped = model(**inputs).logits
        torch.manual_seed(3)
        again = model(**inputs).logits
        model.eval()
    assert not torch.allclose(dropped, plain, **TOL)
    torch.testing.assert_close(again, dropped, rtol=0, atol=0)


def test_custom_4d_mask_is_exact_and_warns_once(monkeypatch):
    ours, eager = _models("llama")
    monkeypatch.setattr(transformers_masks, "_warned_dense_mask", False)
    ids = _ids(2, 8, seed=5)
    # A prefix-LM pattern: the first 3 positions see each other, the rest is causal.
    allowed = torch.ones(8, 8).tril().bool()
    allowed[:3, :3] = True
    mask = allowed.expand(2, 1, 8, 8).clone()
    mask[1, :, :, 0] = False  # and row 1 ignores its first token
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match=r"O\(Sq\*Sk\)"):
            got = ours(input_ids=ids, attention_mask=additive).logits
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second call must not warn again
            got_again = ours(input_ids=ids, attention_mask=additive).logits
        want = eager(input_ids=ids, attention_mask=additive).logits
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_again, got, rtol=0, atol=0)


def test_custom_boolean_4d_mask_matches_eager_with_sinks_and_window(monkeypatch):
    ours, eager = _models("gpt_oss")
    monkeypatch.setattr(transformers_masks, "_warned_dense_mask", True)
    ids = _ids(1, 9, seed=6)
    mask = torch.ones(9, 9).tril().bool()
    mask[5:, 2] = False
    additive = torch.zeros(1, 1, 9, 9).masked_fill(~mask, torch.finfo(torch.float32).min)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask.view(1, 1, 9, 9)).logits
        want = eager(input_ids=ids, attention_mask=additive).logits
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("padded", [False, True])
def test_bidirectional_encoder_with_local_windows_matches_eager(padded, monkeypatch):
    # ModernBERT: bidirectional attention, alternating global and local (sliding-window) layers.
    anyattn_hf.register()

    def build(implementation):
        torch.manual_seed(0)
        config = transformers.ModernBertConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=2, local_attention=4, global_attn_every_n_layers=3,
            max_position_embeddings=128, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, cls_token_id=1, sep_token_id=2)
        return transformers.AutoModelForMaskedLM.from_config(
            config, attn_implementation=implementation).eval()

    ours, eager = build("anyattn"), build("eager")
    ours.load_state_dict(eager.state_dict())
    ids = _ids(2, 12, seed=8)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, -3:] = 0
    spy = _Spy(monkeypatch)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], **TOL)
    assert len(spy.cu_seqlens) == (3 if padded else 0)  # one varlen call per layer when padded


def test_encoder_decoder_cross_attention_over_a_padded_source_matches_eager(monkeypatch):
    # BART: the decoder's cross-attention gets the source's 2-D padding mask with fewer queries
    # than keys; every query row is real there, and no call needs the dense-mask path.
    anyattn_hf.register()

    def build(implementation):
        torch.manual_seed(0)
        config = transformers.BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, init_std=0.2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
        return transformers.AutoModelForSeq2SeqLM.from_config(
            config, attn_implementation=implementation).eval()

    def no_dense_path(*args, **kwargs):
        raise AssertionError("BART took the dense-mask path")

    monkeypatch.setattr(anyattn_hf, "masked_attention", no_dense_path)
    ours, eager = build("anyattn"), build("eager")
    ours.load_state_dict(eager.state_dict())
    source = _ids(2, 11, seed=9)
    mask = torch.ones_like(source)
    mask[1, -4:] = 0
    target = _ids(2, 5, seed=10)
    with torch.no_grad():
        got = ours(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        want = eager(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        torch.testing.assert_close(got, want, **TOL)
        kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, num_beams=1)
        assert torch.equal(ours.generate(source, **kw), eager.generate(source, **kw))


def _prefix_bidirectional(batch_idx, head_idx, q_idx, kv_idx):
    return (q_idx < 3) & (kv_idx < 3)  # e.g. image tokens that see each other


@pytest.mark.parametrize("pattern", ["plain", "padded", "sliding", "or_mask", "chunked"])
def test_mask_function_answers_like_flash_only_where_varlen_is_exact(pattern):
    # The mask transformers' own builders produce for "anyattn": None or the 2-D padding mask where
    # the varlen kernel expresses the pattern, else the exact 4-D mask sdpa would use.
    from transformers import masking_utils

    anyattn_hf.register()
    config = _config("llama")
    config.attention_chunk_size = 3
    config.sliding_window = 4
    embeds = torch.zeros(2, 7, 8)
    mask_2d = torch.ones(2, 7, dtype=torch.long)
    if pattern == "padded":
        mask_2d[1, :2] = 0
    build = dict(plain=masking_utils.create_causal_mask, padded=masking_utils.create_causal_mask,
                 sliding=masking_utils.create_sliding_window_causal_mask,
                 or_mask=masking_utils.create_causal_mask,
                 chunked=masking_utils.create_chunked_causal_mask)[pattern]
    extra = dict(or_mask_function=_prefix_bidirectional) if pattern == "or_mask" else {}

    def mask_for(implementation):
        config._attn_implementation = implementation
        return build(config=config, inputs_embeds=embeds, attention_mask=mask_2d, cache=None,
                     **extra)

    got = mask_for("anyattn")
    if pattern in ("plain", "sliding"):
        assert got is None
    elif pattern == "padded":
        assert torch.equal(got, mask_2d.bool())
    else:
        config._attn_implementation = "sdpa"
        want = build(config=config, inputs_embeds=embeds, attention_mask=mask_2d, cache=None,
                     allow_is_causal_skip=False, **extra)
        assert got.shape == (2, 1, 7, 7) and got.dtype == torch.bool
        assert torch.equal(got, want)


def _vision_towers(name="anyattn"):
    anyattn_hf.register()
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    def build(implementation):
        torch.manual_seed(0)
        config = Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                        patch_size=2, temporal_patch_size=1, spatial_merge_size=2,
                                        window_size=4, out_hidden_size=32, in_channels=3,
                                        fullatt_block_indexes=[1])
        return Qwen2_5_VisionTransformerPretrainedModel._from_config(
            config, attn_implementation=implementation).eval()

    return build(name), build("eager")


def _two_images():
    grid_thw = torch.tensor([[1, 4, 6], [1, 8, 4]])  # (t, h, w): 24 and 32 patches
    patches = int(grid_thw.prod(-1).sum())
    pixels = torch.randn(patches, 3 * 1 * 2 * 2, generator=torch.Generator().manual_seed(7))
    return pixels, grid_thw


def test_vision_tower_over_two_images_matches_eager(monkeypatch):
    # Under the name "anyattn" transformers 5.24 loops over the images (and windows) itself: each
    # piece is one dense anyattn call.
    ours, eager = _vision_towers()
    ours.load_state_dict(eager.state_dict())
    pixels, grid_thw = _two_images()
    dense_calls = []
    real = anyattn_hf.flash_attn_func

    def counting(q, *args, **kwargs):
        dense_calls.append(q.shape[1])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(anyattn_hf, "flash_attn_func", counting)
    with torch.no_grad():
        got = ours(pixels, grid_thw=grid_thw)
        want = eager(pixels, grid_thw=grid_thw)
    assert dense_calls[-2:] == [24, 32]  # the full-attention block: one call per image
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, **TOL)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, **TOL)


def test_vision_tower_under_the_flash_name_is_one_varlen_call_per_block(monkeypatch):
    # Under "anyattn_flash" transformers takes the vision attention's flash branch and passes its
    # cu_seqlens; anyattn answers each block with one varlen call.
    ours, eager = _vision_towers(anyattn_hf.FLASH_NAME)
    assert ours.config._attn_implementation == "anyattn_flash"
    ours.load_state_dict(eager.state_dict())
    spy = _Spy(monkeypatch)
    pixels, grid_thw = _two_images()
    with torch.no_grad():
        got = ours(pixels, grid_thw=grid_thw)
        want = eager(pixels, grid_thw=grid_thw)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, **TOL)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, **TOL)
    assert len(spy.cu_seqlens) == 2  # block 0 windowed, block 1 full attention
    assert spy.cu_seqlens[1] == [0, 24, 56]  # the full-attention block: one sequence per image
    assert len(spy.cu_seqlens[0]) > 3  # the windowed block: several windows per image


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_language_models_under_the_flash_name_match_eager(kind):
    # The flash name changes what transformers hands the attention (flash's masks and kwargs), not
    # the result: a left-padded batch and greedy generation agree with eager. (gpt-oss lists the
    # flash kernels it accepts, and transformers replaces any other flash name by one of them.)
    from transformers import modeling_flash_attention_utils as fa_utils

    ours, eager = _models(kind)
    torch.manual_seed(0)
    flash = transformers.AutoModelForCausalLM.from_config(
        _config(kind), attn_implementation=anyattn_hf.FLASH_NAME).eval()
    flash.load_state_dict(ours.state_dict())
    ids = _ids(2, 9, seed=5)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        got = flash(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)
    generated = flash.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    expected = eager.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(generated, expected)
    # transformers' own flash utilities resolve to anyattn's functions under the name.
    (flash_fn, varlen_fn, *_), _ = fa_utils.lazy_import_flash_attention(anyattn_hf.FLASH_NAME)
    assert flash_fn is anyattn_hf.flash_attn_func and varlen_fn is anyattn_hf.flash_attn_varlen_func


def test_flash_name_must_name_flash():
    with pytest.raises(ValueError, match=r"flash_name: must contain 'flash'.*'fast'"):
        anyattn_hf.register(flash_name="fast")


def test_paged_calls_are_rejected_with_the_parameter_named():
    ours, _ = _models("llama")
    attention = ours.model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 16)
    kv = torch.zeros(1, 2, 3, 16)
    with pytest.raises(ValueError, match="block_table"):
        anyattn_hf.anyattention_forward(attention, q, kv, kv, None,
                                        block_table=torch.zeros(1, 1, dtype=torch.int32))
