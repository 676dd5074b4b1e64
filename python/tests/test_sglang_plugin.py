"""anyattn's sglang plugin against the real sglang 0.5.23, on CPU, through sglang's own entry points.

- ``sglang.srt.plugins.load_plugins()`` finds anyattn's entry point (group ``sglang.srt.plugins``)
  and registers ``QKV_BACKEND_IMPL["anyattn"]``; sglang's own argument parser
  (``ServerArgs.add_cli_args``) then accepts ``--mm-attention-backend anyattn``; the parsed
  record's published ``mm`` namespace holds it, and with that value in the process's published
  configuration (sglang's scoped override) ``VisionAttention`` picks the backend.
- ``fa3`` and ``fa4``, which sglang refuses without CUDA ("VisionFlash4Attention is only available
  for cuda"), construct and run through anyattn with one warning per backend and process.
- every cu_seqlens form sglang's layer passes on (tensor, SingletonCache, VisionAttentionMetadata,
  the cuda-graph list, None), built from sglang's own types.
- sglang's ``VisionAttention`` layer (qkv projection, backend, output projection) on packed
  multi-image input (cu_seqlens with three images of different lengths): anyattn against sglang's
  ``sdpa`` backend, and against an exact float64 computation of the same layer made here, by
  flash-attn's rule (reference.check_2x): max|anyattn - ref64| <= 2 * max|other - ref64| + eps.
  With ``window_size`` and ``s_aux`` (sinks), which sglang's sdpa backend does not apply, the
  other side is the same computation done in float32 instead of sdpa. ``VisionAttention`` passes
  a window only together with sinks (``use_sink=True``, ``full_attn=False``), so a window alone is
  checked on the backend that ``QKV_BACKEND_IMPL["anyattn"]`` names, called as the layer calls it.

sglang and what importing its vision layer needs live in build/sglang-deps (scripts/setup.sh
--python, function install_sglang_test_deps); the directory is appended to sys.path so .venv's
own packages win. Without it these tests skip. The entry point is read from the installed anyattn
distribution; when the installed copy predates the declaration (an editable install made before
it), a stand-in distribution declaring pyproject.toml's own table is put on sys.path instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata

import pytest

torch = pytest.importorskip("torch")

from reference import check_2x, out_eps  # noqa: E402

from anyattn.integrations import sglang_plugin  # noqa: E402
from anyattn.integrations.sglang import VisionAnyAttention  # noqa: E402

SGLANG_VERSION = "0.5.23"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SGLANG_DEPS_DIR = os.environ.get("ANYATTN_SGLANG_DEPS",
                                 os.path.join(REPO_ROOT, "build", "sglang-deps"))
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_VALUE = "anyattn.integrations.sglang_plugin:register"

pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(SGLANG_DEPS_DIR, "sglang")),
    reason=f"sglang is not installed in {SGLANG_DEPS_DIR}: run scripts/setup.sh --python "
    f"(its install_sglang_test_deps step installs sglang {SGLANG_VERSION} without its CUDA stack)")

EMBED_DIM, NUM_HEADS = 64, 4
HEAD_DIM = EMBED_DIM // NUM_HEADS
IMAGE_LENGTHS = (37, 13, 50)  # three images packed along one row


def _declared_entry_points() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11, as sglang 0.5.23's wheels

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return project.get("entry-points", {}).get(PLUGIN_GROUP, {})


def _anyattn_entry_point():
    return [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == "anyattn"]


def _stand_in_distribution(root) -> None:
    """A minimal installed distribution whose entry points are pyproject.toml's sglang table."""
    info = root / "anyattn_sglang_entry_point-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: anyattn-sglang-entry-point\nVersion: 0\n")
    lines = [f"[{PLUGIN_GROUP}]"] + [f"{k} = {v}" for k, v in _declared_entry_points().items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    sys.path.append(str(root))


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    """sglang after load_plugins(), with single-process (gloo, world size 1) parallel state and a
    published default configuration, as sglang's own layer tests set them up."""
    if SGLANG_DEPS_DIR not in sys.path:
        sys.path.append(SGLANG_DEPS_DIR)
    if not _anyattn_entry_point():
        _stand_in_distribution(tmp_path_factory.mktemp("entry_point"))
    saved_whitelist = os.environ.pop("SGLANG_PLUGINS", None)
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    finally:
        if saved_whitelist is not None:
            os.environ["SGLANG_PLUGINS"] = saved_whitelist

    from sglang.srt.distributed import parallel_state

    if not torch.distributed.is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    _publish(_server_args([]))
    import sglang as sglang_package

    yield sglang_package
    # Later test modules in the same session see no process group. (sglang's import-time
    # transformers compatibility patches and the plugin's hooks stay: they cannot be undone.)
    from sglang.srt.runtime_context import reset_context

    parallel_state.destroy_distributed_environment()
    reset_context()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_args(argv):
    """ServerArgs from a command line, parsed by the parser sglang's launcher builds."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "dummy", *argv]))


def _publish(server_args) -> None:
    """Install a configuration for this process as an sglang worker does: publish it (keeping
    the live WORLD group), then build the model-parallel groups (tensor parallel size 1)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context

    reset_context()
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    if parallel_state._WORLD is not None:
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="gloo")


def _vision():
    from sglang.srt.layers.attention import vision

    return vision


def _layer(qkv_backend, *, use_qkv_parallel=True, use_sink=False, window_size=(-1, -1), seed=0,
           softmax_scale=None):
    """A VisionAttention layer with deterministic weights (the same for the same seed)."""
    torch.manual_seed(seed)
    layer = _vision().VisionAttention(
        embed_dim=EMBED_DIM, num_heads=NUM_HEADS, projection_size=EMBED_DIM,
        use_qkv_parallel=use_qkv_parallel, qkv_backend=qkv_backend, flatten_batch=True,
        use_sink=use_sink, window_size=window_size, softmax_scale=softmax_scale)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            std = 1.0 if name == "sinks" else 0.3
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return layer


def _packed_input(seed=2):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, sum(IMAGE_LENGTHS), EMBED_DIM, generator=generator)
    bounds = [0]
    for length in IMAGE_LENGTHS:
        bounds.append(bounds[-1] + length)
    return x, torch.tensor(bounds, dtype=torch.int32)


def _attention(q, k, v, *, scale, window, sinks):
    """Non-causal attention of one sequence, (S, H, D) each, in q's dtype: scores masked to the
    window (key j visible to query i iff i - left <= j <= i + right), the sink logit of each head
    in the softmax denominator only."""
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    n = q.shape[0]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    left, right = window
    visible = torch.ones(n, n, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype)[:, None, None].expand(-1, n, 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :n]
    return torch.einsum("hqk,khd->qhd", probs, v)


def _layer_reference(layer, x, cu_seqlens, *, dtype, window, sinks, scale=HEAD_DIM ** -0.5):
    """sglang VisionAttention's computation with use_qkv_parallel, in ``dtype``: qkv projection,
    attention within each image, output projection."""
    weights = {name: p.detach().to(dtype) for name, p in layer.named_parameters()}
    qkv = torch.nn.functional.linear(x.to(dtype)[0], weights["qkv_proj.weight"],
                                     weights["qkv_proj.bias"])
    q, k, v = (t.reshape(t.shape[0], NUM_HEADS, HEAD_DIM) for t in qkv.split(EMBED_DIM, dim=-1))
    bounds = cu_seqlens.tolist()
    out = torch.cat([
        _attention(q[a:b], k[a:b], v[a:b], scale=scale, window=window, sinks=sinks)
        for a, b in zip(bounds[:-1], bounds[1:])])
    out = torch.nn.functional.linear(out.reshape(out.shape[0], -1), weights["proj.weight"],
                                     weights["proj.bias"])
    return out[None]


def test_pyproject_declares_the_entry_point_that_load_plugins_finds(sglang):
    assert _declared_entry_points() == {"anyattn": PLUGIN_VALUE}
    assert [ep.value for ep in _anyattn_entry_point()][:1] == [PLUGIN_VALUE]
    assert sglang.__version__ == SGLANG_VERSION


def test_load_plugins_registers_the_backend(sglang):
    assert _vision().QKV_BACKEND_IMPL["anyattn"] is VisionAnyAttention


def test_command_line_accepts_anyattn_and_still_rejects_unknown_names(sglang, capsys):
    assert _server_args(["--mm-attention-backend", "anyattn"]).mm_attention_backend == "anyattn"
    assert _server_args(["--mm-attention-backend", "sdpa"]).mm_attention_backend == "sdpa"
    with pytest.raises(SystemExit):
        _server_args(["--mm-attention-backend", "no_such_backend"])
    assert "invalid choice: 'no_such_backend'" in capsys.readouterr().err


def test_command_line_choice_selects_anyattn_in_vision_attention(sglang):
    from sglang.srt.runtime_context import create_context, get_mm

    parsed = _server_args(["--mm-attention-backend", "anyattn"])
    published = create_context(parsed, role="test").config_bag("mm").mm_attention_backend
    assert published == "anyattn"
    # The process keeps its published default; sglang's scoped override stands in for it.
    with get_mm().override(mm_attention_backend=published):
        layer = _layer(None)
        pinned = _layer("sdpa")  # the server-wide choice wins over a layer's own, as in sglang
    assert layer.qkv_backend_name == "anyattn" and pinned.qkv_backend_name == "anyattn"
    assert isinstance(layer.qkv_backend, VisionAnyAttention)


@pytest.mark.parametrize("name, class_name", [("fa3", "VisionFlash3Attention"),
                                              ("fa4", "VisionFlash4Attention")])
def test_fa3_and_fa4_fall_back_to_anyattn_with_one_warning(sglang, caplog, monkeypatch, name,
                                                           class_name):
    backend_class = getattr(_vision(), class_name)
    # sglang's own constructor, under the plugin's hook, still refuses this machine.
    with pytest.raises(Exception, match=f"{class_name} is only available for cuda"):
        backend_class.__init__.__wrapped__(object.__new__(backend_class))

    monkeypatch.setattr(sglang_plugin, "_announced_fallbacks", set())
    caplog.set_level(logging.WARNING, logger=sglang_plugin.__name__)
    layers = [_layer(name, seed=3), _layer(name, seed=3)]
    direct = _vision().QKV_BACKEND_IMPL[name](head_dim=HEAD_DIM, num_heads=NUM_HEADS,
                                              num_kv_heads=NUM_HEADS)
    notices = [r for r in caplog.records if r.name == sglang_plugin.__name__]
    assert len(notices) == 1, [r.getMessage() for r in notices]
    assert f"'{name}'" in notices[0].getMessage() and "'anyattn'" in notices[0].getMessage()
    assert isinstance(direct, backend_class)
    assert all(isinstance(layer.qkv_backend, backend_class) for layer in layers)

    # fa3/fa4 get strided q/k/v views from the layer; the result is the anyattn layer's.
    x, cu_seqlens = _packed_input()
    reference = _layer("anyattn", seed=3)
    with torch.no_grad():
        torch.testing.assert_close(layers[0](x, cu_seqlens=cu_seqlens),
                                   reference(x, cu_seqlens=cu_seqlens), rtol=0, atol=0)


@pytest.mark.parametrize("dtype, softmax_scale", [("float32", None), ("bfloat16", None),
                                                  ("float32", 0.4)])
def test_vision_attention_matches_sdpa_on_packed_images(sglang, dtype, softmax_scale):
    x, cu_seqlens = _packed_input()
    x = x.to(getattr(torch, dtype))
    anyattn_layer = _layer("anyattn", softmax_scale=softmax_scale).to(x.dtype)
    sdpa_layer = _layer("sdpa", softmax_scale=softmax_scale).to(x.dtype)
    with torch.no_grad():
        got = anyattn_layer(x, cu_seqlens=cu_seqlens)
        sdpa = sdpa_layer(x, cu_seqlens=cu_seqlens)
    ref64 = _layer_reference(anyattn_layer, x, cu_seqlens, dtype=torch.float64, window=(-1, -1),
                             sinks=None, scale=softmax_scale or HEAD_DIM ** -0.5)
    as_numpy = lambda t: t.double().numpy()  # noqa: E731
    check_2x("out", as_numpy(got), as_numpy(ref64), as_numpy(sdpa),
             out_eps(dtype, as_numpy(ref64)))
    if dtype == "float32":
        # Images must not see each other: sdpa gets that from its block-diagonal mask.
        torch.testing.assert_close(got, sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["singleton_cache", "forward_metadata", "graph_list",
                                  "empty_singleton_cache", "none"])
def test_vision_attention_takes_every_cu_seqlens_form_sglang_passes(sglang, form):
    # The forms are built with sglang's own types; each must give the result of the plain tensor
    # it stands for (an empty cache or None: one sequence over the whole row, as bsz=1 implies).
    vision = _vision()
    x, cu_seqlens = _packed_input()
    whole_row = torch.tensor([0, x.shape[1]], dtype=torch.int32)
    cache = vision.SingletonCache()
    if form == "singleton_cache":
        cache.set_data(cu_seqlens)
    metadata = vision.prepare_vision_attention_metadata(cu_seqlens, x.device)
    arguments, expected_bounds = {
        "singleton_cache": (dict(cu_seqlens=cache), cu_seqlens),
        "forward_metadata": (dict(cu_seqlens=None, forward_metadata=metadata), cu_seqlens),
        "graph_list": (dict(cu_seqlens=[cu_seqlens, max(IMAGE_LENGTHS)]), cu_seqlens),
        "empty_singleton_cache": (dict(cu_seqlens=cache), whole_row),
        "none": (dict(cu_seqlens=None), whole_row),
    }[form]
    layer = _layer("anyattn")
    with torch.no_grad():
        got = layer(x, **arguments)
        expected = layer(x, cu_seqlens=expected_bounds)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if form == "empty_singleton_cache":
        assert cache.get_data().tolist() == whole_row.tolist()


@pytest.mark.parametrize("window", [(-1, -1), (5, 5), (0, 9)])
def test_vision_attention_window_and_sinks_match_exact_reference(sglang, window):
    # sglang's sdpa backend drops window_size and s_aux, so the comparison is the layer computed
    # here: exactly (float64) and in float32 as the same-dtype side of the 2x rule.
    x, cu_seqlens = _packed_input()
    layer = _layer("anyattn", use_sink=True, window_size=window)
    with torch.no_grad():
        got = layer(x, cu_seqlens=cu_seqlens, full_attn=False)
        full = layer(x, cu_seqlens=cu_seqlens, full_attn=True)
        sinks = layer.sinks.detach()
        ref64 = _layer_reference(layer, x, cu_seqlens, dtype=torch.float64, window=window,
                                 sinks=sinks.double())
        naive = _layer_reference(layer, x, cu_seqlens, dtype=torch.float32, window=window,
                                 sinks=sinks.float())
    check_2x("out", got.numpy(), ref64.numpy(), naive.numpy(), out_eps("float32", ref64.numpy()))
    assert not torch.allclose(got, full, atol=1e-3), "window/s_aux had no effect"


@pytest.mark.parametrize("window", [(5, 5), (3, 0)])
def test_backend_window_without_sinks_matches_exact_reference(sglang, window):
    # VisionAttention passes window_size only together with sinks; a model calling its backend
    # directly (QKV_BACKEND_IMPL[name](...).forward, as gemma4 does) can pass it alone.
    generator = torch.Generator().manual_seed(4)
    total = sum(IMAGE_LENGTHS)
    q, k, v = (torch.randn(total, NUM_HEADS, HEAD_DIM, generator=generator) for _ in range(3))
    _, cu_seqlens = _packed_input()
    backend = _vision().QKV_BACKEND_IMPL["anyattn"](head_dim=HEAD_DIM, num_heads=NUM_HEADS,
                                                    num_kv_heads=NUM_HEADS)
    got = backend.forward(q=q, k=k, v=v, bsz=1, seq_len=total, cu_seqlens=cu_seqlens,
                          attention_mask=None, forward_metadata=None, softmax_scale=None,
                          window_size=window, s_aux=None)
    bounds = cu_seqlens.tolist()

    def reference(dtype):
        return torch.cat([
            _attention(q[a:b].to(dtype), k[a:b].to(dtype), v[a:b].to(dtype),
                       scale=HEAD_DIM ** -0.5, window=window, sinks=None)
            for a, b in zip(bounds[:-1], bounds[1:])])

    ref64 = reference(torch.float64)
    check_2x("out", got.numpy(), ref64.numpy(), reference(torch.float32).numpy(),
             out_eps("float32", ref64.numpy()))
