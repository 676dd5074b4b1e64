"""flash-attn 2.8's Python API, as served by anyattn, checked the way FlashAttention's own suite
(tests/test_flash_attn.py upstream) checks flash-attn on CUDA.

conftest.py has run ``anyattn.install_as_flash_attn()``; from here on only flash-attn's names are
used, exactly as a model file, ring-flash-attn or a serving engine would use them.

How results are judged (upstream's rule): a float64 reference is computed from the very inputs the
kernel sees, and a naive reference is computed "as PyTorch would" in the inputs' precision (every
op rounded to the input dtype, the scale applied to k instead of q). The kernel passes when

    max |kernel - reference| <= 2 * max |naive - reference| + eps

for the output and for every gradient, eps being the dtype's epsilon times the largest
|reference| (about one ulp: the rule of this project's C++ and Python suites; it only matters
where the naive error is exactly zero, a lone visible key for instance). The naive reference
rounds like a low-precision op but multiplies in float32 (``x.to(dtype).to(float32)`` after
every op, which is what torch's CPU half-precision matmul does internally, at a fraction of its
cost). flash-attn has no float32; float32 cases here check agreement between entry points
(private functions against the public ones, ring blocks against the whole attention), not the
2x rule, which the library's float32 backward is known to exceed by a small factor (see
python/tests/test_backward.py).

Grids: upstream takes the full cross product of every axis on a GPU. Here the semantic axes
(dtype, causal, local window, ALiBi/softcap, MHA/GQA/MQA, ...) are crossed in full, and the
secondary ones (head dim and sequence lengths, packed layouts, deterministic, padding mode, ...)
are dealt out over those cases, each value equally often, in a fixed shuffled order (see
``grid``), so the folder stays within a few minutes on a 2-core machine.
"""

from __future__ import annotations

import inspect
import itertools
import math
import random
import re

import pytest

torch = pytest.importorskip("torch", reason="flash-attn's API is a torch API")

import flash_attn  # noqa: E402  (served by anyattn; see conftest.py)
import flash_attn.flash_attn_interface as fai  # noqa: E402
from flash_attn import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input  # noqa: E402
from flash_attn.flash_attn_interface import (  # noqa: E402
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
)

DTYPES = [torch.float16, torch.bfloat16]
NHEADS = 6
KV_HEADS = {"mha": 6, "gqa": 2, "mqa": 1}
MHA_TYPES = list(KV_HEADS)
DROPOUT_P = 0.17


# ---- parametrisation ------------------------------------------------------------------------


def _case_id(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, (tuple, list)):
        return "x".join(_case_id(v) for v in value)
    return str(value)


def grid(full, dealt=None):
    """``parametrize`` arguments: the cross product of the ``full`` axes (name -> values), each
    case also drawing one value of every ``dealt`` axis. A dealt axis's values are repeated to the
    number of cases and shuffled with a fixed seed, so each value is used equally often and is not
    tied to any one full axis."""
    dealt = dealt or {}
    combos = list(itertools.product(*full.values()))
    columns = []
    for n, values in enumerate(dealt.values()):
        column = [values[i % len(values)] for i in range(len(combos))]
        random.Random(20250 + n).shuffle(column)
        columns.append(column)
    names = list(full) + list(dealt)
    cases = []
    for i, combo in enumerate(combos):
        values = tuple(combo) + tuple(column[i] for column in columns)
        ident = "-".join(f"{name}={_case_id(v)}" for name, v in zip(names, values))
        cases.append(pytest.param(*values, id=ident))
    return ",".join(names), cases


def round128(n: int) -> int:
    return (n + 127) // 128 * 128


# ---- references -----------------------------------------------------------------------------


def visibility(batch, seqlen_q, seqlen_k, q_lens=None, k_lens=None, k_start=None, causal=False,
               window_size=(-1, -1)):
    """(visible (B, 1, Sq, Sk) bool, distance (B, 1, Sq, Sk)) in flash-attn's conventions.

    Sequence b has q_lens[b] queries (rows 0..) and k_lens[b] keys starting at column k_start[b]
    (left padding of a KV cache). Masks are aligned bottom-right per sequence: query i sits on key
    position i + k_lens[b] - q_lens[b]; ``distance`` is |that diagonal - key position| (ALiBi's).
    Causal means a right window of 0.
    """
    full_q = torch.full((batch,), seqlen_q, dtype=torch.long)
    q_lens = full_q if q_lens is None else q_lens.to(torch.long)
    k_start = torch.zeros(batch, dtype=torch.long) if k_start is None else k_start.to(torch.long)
    k_lens = (seqlen_k - k_start) if k_lens is None else k_lens.to(torch.long)
    rows = torch.arange(seqlen_q).view(1, 1, -1, 1)
    pos = torch.arange(seqlen_k).view(1, 1, 1, -1) - k_start.view(-1, 1, 1, 1)
    diagonal = rows + (k_lens - q_lens).view(-1, 1, 1, 1)
    visible = (pos >= 0) & (pos < k_lens.view(-1, 1, 1, 1)) & (rows < q_lens.view(-1, 1, 1, 1))
    left, right = window_size
    if causal:
        right = 0
    if right >= 0:
        visible = visible & (pos <= diagonal + right)
    if left >= 0:
        visible = visible & (pos >= diagonal - left)
    return visible, (diagonal - pos).abs()


def attention_reference(q, k, v, *, q_lens=None, k_lens=None, k_start=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
                        dropout_p=0.0, keep=None, upcast=True, reorder_ops=False, out_dtype=None):
    """Attention written out plainly: (out (B, Sq, Hq, Dv), probs (B, Hq, Sq, Sk), lse (B, Hq, Sq)).

    upcast=True: float64 throughout (the reference). upcast=False: every op rounded to q's dtype
    (the naive implementation). reorder_ops scales k instead of q. ``keep`` (B, Hq, Sq, Sk) bool
    is a dropout keep mask (kept probabilities are scaled by 1 / (1 - dropout_p)). Rows without a
    visible key give out 0, probs 0 and lse -inf. ``probs`` are before dropout.
    """
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if upcast:
        work = torch.float64

        def rnd(t):
            return t
    else:
        work, low = torch.float32, q.dtype

        def rnd(t):
            return t.to(low).to(torch.float32)

    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    if upcast:  # GQA/MQA: dk/dv summed over each group in float64
        q, k, v = (x.to(work) for x in (q, k, v))
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    else:  # ... or, as PyTorch in the dtype does it, from per-head gradients rounded to it
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        q, k, v = (x.to(work) for x in (q, k, v))
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    if reorder_ops:
        scores = torch.einsum("bihd,bjhd->bhij", q, rnd(k * scale))
    else:
        scores = torch.einsum("bihd,bjhd->bhij", rnd(q * scale), k)
    scores = rnd(scores)
    if softcap > 0:
        scores = rnd(torch.tanh(rnd(scores / softcap)) * softcap)
    visible, distance = visibility(batch, seqlen_q, seqlen_k, q_lens, k_lens, k_start, causal,
                                   window_size)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(work).reshape(-1, nheads, 1, 1)
        scores = rnd(scores - slopes * distance.to(work))
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty_row = ~visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(empty_row, 0.0), dim=-1).masked_fill(~visible, 0.0)
    probs = rnd(probs)
    weights = probs if keep is None else probs.masked_fill(~keep, 0.0)
    out = rnd(torch.einsum("bhij,bjhd->bihd", weights, v))
    if dropout_p > 0.0:
        out = rnd(out / (1.0 - dropout_p))
    return out.to(out_dtype), probs.to(out_dtype), lse


def rule_eps(ref, dtype):
    """eps of the rule: as in this project's own suites (tests/common/test_support.cc, reference.py), the
    dtype's machine epsilon times the largest |reference|, about one ulp there; at least 1e-5,
    upstream's absolute eps. It matters only where the naive error is exactly 0: with a lone
    visible key the naive sum of a GQA group is correctly rounded while a kernel that recomputes
    P = exp(s - lse) in float32 may land a tie on the other side, and dq is exactly 0 in float64
    while rowsum(dout * out) - dout . v leaves float32 noise (~1e-7) in a kernel's."""
    largest = ref.double().abs().max().item() if ref.numel() else 0.0
    return max(torch.finfo(dtype).eps * largest if math.isfinite(largest) else 0.0, 1e-5)


def assert_rule(what, got, ref, naive, dtype, where=None):
    """Upstream's criterion: the kernel's max error is at most twice the naive one, plus eps."""
    err = (got.double() - ref.double()).abs()
    base = (naive.double() - ref.double()).abs()
    if where is not None:
        err, base, ref = err[where], base[where], ref[where]
    err = err.max().item() if err.numel() else 0.0
    base = base.max().item() if base.numel() else 0.0
    eps = rule_eps(ref, dtype)
    assert err <= 2 * base + eps, (f"{what}: max |flash_attn - reference| = {err:.4g} > 2 * "
                                   f"{base:.4g} (naive {dtype} error) + {eps:.3g}")


def assert_lse(lse, lse_ref):
    """Rows with a visible key: the float64 logsumexp. Rows without one: an infinity (flash-attn
    2.x writes +inf there, anyattn documents -inf; both keep such rows out of LSE merges)."""
    assert lse.dtype == torch.float32
    finite = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[finite], lse_ref[finite].float(), rtol=1e-4, atol=1e-4)
    assert torch.isinf(lse[~finite]).all(), "rows without a visible key must have an infinite LSE"


def random_window(seqlen_k):
    return tuple(int(x) for x in torch.randint(0, max(seqlen_k, 1), (2,)))


def random_padding_mask(max_len, batch, mode):
    """(batch, max_len) bool, True on each sequence's first lengths[b] positions."""
    if mode == "full":
        lengths = torch.full((batch,), max_len)
    elif mode == "random":
        lengths = torch.randint(max(1, max_len - 20), max_len + 1, (batch,))
    else:  # "third"
        lengths = torch.randint(max(1, max_len // 3), max_len + 1, (batch,))
    return torch.arange(max_len)[None, :] < lengths[:, None]


def score_options(score_mod, batch, q):
    """(q, softcap, alibi_slopes) for a score modifier. Softcap cases scale q up so that the
    tanh is far from linear."""
    if score_mod == "softcap":
        return q * 3, 2.5, None
    if score_mod == "alibi":
        return q, 0.0, torch.rand(batch, NHEADS) * 0.3
    return q, 0.0, None


def keep_mask_from_s_dmask(s_dmask, batch, nheads, rows, cols, seqlen_q, seqlen_k, dtype):
    """Check S_dmask's shape and dtype (flash-attn's: (B, H, round128(rows), round128(cols)) in q's
    dtype) and read its [:rows, :cols] corner: (keep mask, probabilities), laid out over
    (B, H, seqlen_q, seqlen_k) (entries outside the corner: kept, probability 0)."""
    assert s_dmask.shape == (batch, nheads, round128(rows), round128(cols))
    assert s_dmask.dtype == dtype
    corner = s_dmask[:, :, :rows, :cols]
    keep = torch.ones(batch, nheads, seqlen_q, seqlen_k, dtype=torch.bool)
    probs = torch.zeros(batch, nheads, seqlen_q, seqlen_k, dtype=dtype)
    r, c = min(rows, seqlen_q), min(cols, seqlen_k)
    # Dropped entries are negated: the sign bit is the keep mask (a probability that rounds to
    # 0 in the dtype is -0.0 when dropped, which ``>= 0`` would read as kept).
    keep[:, :, :r, :c] = ~torch.signbit(corner[:, :, :r, :c])
    probs[:, :, :r, :c] = corner[:, :, :r, :c].abs()
    return keep, probs


def assert_dropout_fraction(keep, visible, p):
    visible = visible.expand_as(keep)
    dropped = (~keep & visible).sum().item() / visible.sum().item()
    assert abs(dropped - p) <= 0.01, f"dropped fraction {dropped:.4f}, expected {p}"


def grads_of(out, inputs, g):
    return torch.autograd.grad(out, inputs, g, retain_graph=True)


# ---- the package ----------------------------------------------------------------------------

# flash-attn 2.8's private functions, as ring-flash-attn and others read them with
# inspect.getfullargspec: (parameter names, defaults).
PRIVATE_SIGNATURES = {
    "_flash_attn_forward": (
        ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size_left",
         "window_size_right", "softcap", "alibi_slopes", "return_softmax"],
        None,
    ),
    "_flash_attn_backward": (
        ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "dropout_p",
         "softmax_scale", "causal", "window_size_left", "window_size_right", "softcap",
         "alibi_slopes", "deterministic", "rng_state"],
        (None,),
    ),
    "_flash_attn_varlen_forward": (
        ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
         "dropout_p", "softmax_scale", "causal", "window_size_left", "window_size_right",
         "softcap", "alibi_slopes", "return_softmax", "block_table", "leftpad_k", "seqused_k"],
        (-1, -1, 0.0, None, False, None, None, None),
    ),
    "_flash_attn_varlen_backward": (
        ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "cu_seqlens_q",
         "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale", "causal",
         "window_size_left", "window_size_right", "softcap", "alibi_slopes", "deterministic",
         "rng_state"],
        (None,),
    ),
}

_COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
           ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
           ("deterministic", False), ("return_attn_probs", False)]
_REQUIRED = inspect.Parameter.empty

# flash-attn 2.8's public functions: (name, default) in order. anyattn may add keyword
# parameters after them (sinks, seqused_k), never before.
PUBLIC_SIGNATURES = {
    "flash_attn_func": [("q", _REQUIRED), ("k", _REQUIRED), ("v", _REQUIRED)] + _COMMON,
    "flash_attn_qkvpacked_func": [("qkv", _REQUIRED)] + _COMMON,
    "flash_attn_kvpacked_func": [("q", _REQUIRED), ("kv", _REQUIRED)] + _COMMON,
    "flash_attn_varlen_func": [
        ("q", _REQUIRED), ("k", _REQUIRED), ("v", _REQUIRED), ("cu_seqlens_q", _REQUIRED),
        ("cu_seqlens_k", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
    ] + _COMMON + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [
        ("qkv", _REQUIRED), ("cu_seqlens", _REQUIRED), ("max_seqlen", _REQUIRED)] + _COMMON,
    "flash_attn_varlen_kvpacked_func": [
        ("q", _REQUIRED), ("kv", _REQUIRED), ("cu_seqlens_q", _REQUIRED),
        ("cu_seqlens_k", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
    ] + _COMMON,
    "flash_attn_with_kvcache": [
        ("q", _REQUIRED), ("k_cache", _REQUIRED), ("v_cache", _REQUIRED), ("k", None),
        ("v", None), ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False),
    ],
}


def test_version_is_flash_attn_2_8():
    version = flash_attn.__version__
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", version)
    assert match, f"flash_attn.__version__ {version!r} does not parse"
    assert tuple(int(x) for x in match.groups()) >= (2, 8, 0)
    assert version == "2.8.3"


def test_interface_module_holds_the_package_functions():
    import flash_attn.flash_attn_interface as interface

    assert interface is fai
    for name in PUBLIC_SIGNATURES:
        assert getattr(flash_attn, name) is getattr(fai, name), name
    assert fai.flash_attn_func is flash_attn.flash_attn_func
    for name in PRIVATE_SIGNATURES:
        assert callable(getattr(fai, name)), name


@pytest.mark.parametrize("name", sorted(PRIVATE_SIGNATURES))
def test_private_function_argspec(name):
    spec = inspect.getfullargspec(getattr(fai, name))
    args, defaults = PRIVATE_SIGNATURES[name]
    assert spec.args == args
    assert spec.defaults == defaults
    assert spec.varargs is None and spec.varkw is None and not spec.kwonlyargs


@pytest.mark.parametrize("name", sorted(PUBLIC_SIGNATURES))
def test_public_function_signature(name):
    params = list(inspect.signature(getattr(flash_attn, name)).parameters.values())
    expected = PUBLIC_SIGNATURES[name]
    got = [(p.name, p.default) for p in params[:len(expected)]]
    assert got == expected
    for p in params:  # positional calls in flash-attn's order keep working
        assert p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, p
    for extra in params[len(expected):]:
        assert extra.default is None, f"extra parameter {extra.name} must default to None"


def test_private_forward_called_the_ring_flash_attn_way():
    """ring-flash-attn fills a dict from getfullargspec's defaults and calls with **kwargs."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 37, 4, 32, dtype=torch.bfloat16) for _ in range(3))
    spec = inspect.getfullargspec(_flash_attn_forward)
    defaults = spec.defaults or ()
    params = dict(zip(spec.args, (None,) * (len(spec.args) - len(defaults)) + tuple(defaults)))
    params.update(q=q, k=k, v=v, dropout_p=0.0, softmax_scale=32 ** -0.5, causal=True,
                  window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
                  return_softmax=False)
    out, lse, s_dmask, rng_state = _flash_attn_forward(**params)
    assert out.shape == q.shape and lse.shape == (1, 4, 37)
    expected = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, expected)
    assert s_dmask.shape == (0,) and rng_state.shape == (2,) and rng_state.dtype == torch.int64


def test_return_conventions():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 2, 16) for _ in range(3))
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5, 2, 16)
    result = flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3
    out2, lse, s_dmask = result
    assert torch.equal(out, out2) and lse.shape == (2, 2, 5) and s_dmask.shape == (0,)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    result = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 5,
                                    5, return_attn_probs=True)
    assert len(result) == 3
    assert result[1].shape == (2, 10) and result[2].shape == (0,)
    torch.testing.assert_close(result[0], out.flatten(0, 1))


# ---- dense functions ------------------------------------------------------------------------


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "causal": [False, True], "d": [32, 59, 64, 128, 256],
     "dropout_p": [0.0, DROPOUT_P]},
    {"seqlen": [97, 128, 217]},
))
def test_flash_attn_qkvpacked(dtype, causal, d, dropout_p, seqlen):
    torch.manual_seed(0)
    batch = 2
    qkv = torch.randn(batch, seqlen, 3, NHEADS, d, dtype=dtype, requires_grad=True)
    out, lse, s_dmask = flash_attn_qkvpacked_func(qkv, dropout_p, causal=causal,
                                                  return_attn_probs=True)
    assert out.shape == (batch, seqlen, NHEADS, d) and out.dtype == dtype
    assert lse.shape == (batch, NHEADS, seqlen)
    q, k, v = qkv.unbind(dim=2)
    keep = None
    if dropout_p > 0.0:
        keep, probs = keep_mask_from_s_dmask(s_dmask, batch, NHEADS, seqlen, seqlen, seqlen,
                                             seqlen, dtype)
    else:
        assert s_dmask.shape == (0,) and s_dmask.dtype == dtype
    args = dict(causal=causal, dropout_p=dropout_p, keep=keep)
    out_ref, probs_ref, lse_ref = attention_reference(q, k, v, **args)
    out_pt, probs_pt, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)
    assert_lse(lse, lse_ref)
    if dropout_p > 0.0:
        visible, _ = visibility(batch, seqlen, seqlen, causal=causal)
        assert_rule("S_dmask probabilities", probs, probs_ref, probs_pt, dtype)
        assert_dropout_fraction(keep, visible, dropout_p)
    g = torch.randn_like(out)
    (dqkv,) = grads_of(out, (qkv,), g)
    (dqkv_ref,) = grads_of(out_ref, (qkv,), g)
    (dqkv_pt,) = grads_of(out_pt, (qkv,), g)
    for i, name in enumerate("qkv"):
        assert_rule(f"d{name}", dqkv[:, :, i], dqkv_ref[:, :, i], dqkv_pt[:, :, i], dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": MHA_TYPES, "causal": [False, True], "local": [False, True],
     "score_mod": ["none", "alibi", "softcap"]},
    {"kvpacked": [False, True], "deterministic": [False, True],
     "shape": [(32, 113, 203), (59, 128, 217), (64, 217, 113), (128, 64, 128), (256, 1, 239),
               (40, 3, 3), (96, 108, 256), (111, 239, 1), (64, 256, 512), (32, 512, 256),
               (160, 113, 211)]},
))
def test_flash_attn_output(dtype, mha_type, causal, local, score_mod, kvpacked, deterministic,
                           shape):
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 2, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    q, softcap, alibi = score_options(score_mod, batch, q)
    q.requires_grad_()
    window = random_window(seqlen_k) if local else (-1, -1)
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi)
    if kvpacked:
        kv = torch.randn(batch, seqlen_k, 2, nheads_k, d, dtype=dtype, requires_grad=True)
        k, v = kv.unbind(dim=2)
        inputs, names = (q, kv), ("dq", "dkv")
        out, lse, s_dmask = flash_attn_kvpacked_func(q, kv, 0.0, deterministic=deterministic,
                                                     return_attn_probs=True, **options)
    else:
        k = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
        v = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
        inputs, names = (q, k, v), ("dq", "dk", "dv")
        out, lse, s_dmask = flash_attn_func(q, k, v, 0.0, deterministic=deterministic,
                                            return_attn_probs=True, **options)
    assert out.shape == (batch, seqlen_q, NHEADS, d) and out.dtype == dtype
    assert lse.shape == (batch, NHEADS, seqlen_q)
    assert s_dmask.shape == (0,) and s_dmask.dtype == dtype
    out_ref, _, lse_ref = attention_reference(q, k, v, **options)
    out_pt, _, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **options)
    assert_rule("out", out, out_ref, out_pt, dtype)
    assert_lse(lse, lse_ref)

    g = torch.randn_like(out)
    grads = grads_of(out, inputs, g)
    grads_ref = grads_of(out_ref, inputs, g)
    grads_pt = grads_of(out_pt, inputs, g)
    for name, got, ref, naive in zip(names, grads, grads_ref, grads_pt):
        assert_rule(name, got, ref, naive, dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": ["mha", "gqa"], "causal": [False, True],
     "shape": [(32, 113, 203), (64, 256, 128), (128, 97, 97)]},
    {"kvpacked": [False, True], "local": [False, True], "alibi": [False, True]},
))
def test_flash_attn_dropout(dtype, mha_type, causal, shape, kvpacked, local, alibi):
    """The keep mask is read back from S_dmask and the reference is built with it."""
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 2, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype, requires_grad=True)
    kv = torch.randn(batch, seqlen_k, 2, nheads_k, d, dtype=dtype, requires_grad=True)
    k, v = kv.unbind(dim=2)
    window = random_window(seqlen_k) if local else (-1, -1)
    slopes = torch.rand(NHEADS) * 0.3 if alibi else None
    options = dict(causal=causal, window_size=window, alibi_slopes=slopes)
    if kvpacked:
        out, lse, s_dmask = flash_attn_kvpacked_func(q, kv, DROPOUT_P, return_attn_probs=True,
                                                     **options)
    else:
        out, lse, s_dmask = flash_attn_func(q, k, v, DROPOUT_P, return_attn_probs=True,
                                            **options)
    keep, probs = keep_mask_from_s_dmask(s_dmask, batch, NHEADS, seqlen_q, seqlen_k, seqlen_q,
                                         seqlen_k, dtype)
    args = dict(options, dropout_p=DROPOUT_P, keep=keep)
    out_ref, probs_ref, lse_ref = attention_reference(q, k, v, **args)
    out_pt, probs_pt, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)
    assert_rule("S_dmask probabilities", probs, probs_ref, probs_pt, dtype)
    assert_lse(lse, lse_ref)  # the LSE ignores dropout
    visible, _ = visibility(batch, seqlen_q, seqlen_k, causal=causal, window_size=window)
    assert_dropout_fraction(keep, visible, DROPOUT_P)

    g = torch.randn_like(out)
    for name, got, ref, naive in zip(("dq", "dkv"), grads_of(out, (q, kv), g),
                                     grads_of(out_ref, (q, kv), g), grads_of(out_pt, (q, kv), g)):
        assert_rule(name, got, ref, naive, dtype)


def test_dropout_is_seeded_by_torch_manual_seed():
    q, k, v = (torch.randn(2, 64, 4, 32, dtype=torch.bfloat16) for _ in range(3))

    def run(seed):
        torch.manual_seed(seed)
        return flash_attn_func(q, k, v, 0.3, return_attn_probs=True)

    out_a, _, s_a = run(1)
    out_b, _, s_b = run(1)
    out_c, _, s_c = run(2)
    assert torch.equal(out_a, out_b) and torch.equal(s_a, s_b)
    assert not torch.equal(s_a >= 0, s_c >= 0)
    assert not torch.equal(out_a, out_c)
    out_eval = flash_attn_func(q, k, v, 0.0)
    assert not torch.equal(out_a, out_eval)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_deterministic_backward(dtype, causal):
    torch.manual_seed(0)
    q = torch.randn(2, 150, NHEADS, 64, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 211, 2, 64, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 211, 2, 64, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 150, NHEADS, 64, dtype=dtype)
    runs = []
    for _ in range(3):
        torch.manual_seed(5)
        out = flash_attn_func(q, k, v, DROPOUT_P, causal=causal, deterministic=True)
        runs.append((out,) + grads_of(out, (q, k, v), g))
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_backward_noncontiguous_dout(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 96, NHEADS, 64, dtype=dtype, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    g = torch.randn(2, NHEADS, 96, 64, dtype=dtype).transpose(1, 2)  # (b, s, h, d), strided
    assert not g.is_contiguous()
    grads_strided = grads_of(out, (q, k, v), g)
    grads_plain = grads_of(out, (q, k, v), g.contiguous())
    for a, b in zip(grads_strided, grads_plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_large_scores(dtype, causal):
    """Scores in the hundreds: no overflow in the forward or the backward."""
    torch.manual_seed(0)
    q = (torch.randn(2, 128, NHEADS, 64) * 5).to(dtype).requires_grad_()
    k = (torch.randn(2, 160, NHEADS, 64) * 5).to(dtype).requires_grad_()
    v = torch.randn(2, 160, NHEADS, 64, dtype=dtype, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal)
    out_ref, _, _ = attention_reference(q, k, v, causal=causal)
    out_pt, _, _ = attention_reference(q, k, v, causal=causal, upcast=False, reorder_ops=True)
    assert torch.isfinite(out).all()
    assert_rule("out", out, out_ref, out_pt, dtype)
    g = torch.randn_like(out)
    for name, got, ref, naive in zip(("dq", "dk", "dv"), grads_of(out, (q, k, v), g),
                                     grads_of(out_ref, (q, k, v), g),
                                     grads_of(out_pt, (q, k, v), g)):
        assert torch.isfinite(got).all()
        assert_rule(name, got, ref, naive, dtype)


# ---- variable length ------------------------------------------------------------------------


class Packed:
    """A padded batch and its packed (varlen) form through flash_attn.bert_padding."""

    def __init__(self, x, mask):
        self.padded = x
        self.mask = mask
        self.unpadded, self.indices, self.cu_seqlens, self.max_seqlen, _ = unpad_input(x, mask)
        self.lengths = mask.sum(dim=-1)
        self.batch, self.seqlen = mask.shape

    def leaf(self):
        return self.unpadded.detach().requires_grad_()

    def pad(self, x_unpadded):
        return pad_input(x_unpadded, self.indices, self.batch, self.seqlen)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": MHA_TYPES, "causal": [False, True], "local": [False, True],
     "score_mod": ["none", "alibi", "softcap"]},
    {"kvpacked": [False, True], "deterministic": [False, True],
     "mode": ["random", "third", "full"],
     "shape": [(32, 113, 203), (59, 128, 217), (64, 1, 147), (128, 217, 113), (256, 64, 128),
               (80, 97, 97), (40, 3, 50), (64, 256, 512), (96, 113, 211), (224, 128, 128)]},
))
def test_flash_attn_varlen_output(dtype, mha_type, causal, local, score_mod, kvpacked,
                                  deterministic, mode, shape):
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 3, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    q, softcap, alibi = score_options(score_mod, batch, q)
    q.requires_grad_()
    k = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
    pq = Packed(q, random_padding_mask(seqlen_q, batch, mode))
    pk = Packed(k, random_padding_mask(seqlen_k, batch, mode))
    pv = Packed(v, pk.mask)
    window = random_window(seqlen_k) if local else (-1, -1)
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi)
    q_u = pq.leaf()
    if kvpacked:
        kv_u = torch.stack([pk.unpadded, pv.unpadded], dim=1).detach().requires_grad_()
        leaves = (q_u, kv_u)
        out_u, lse, s_dmask = flash_attn_varlen_kvpacked_func(
            q_u, kv_u, pq.cu_seqlens, pk.cu_seqlens, pq.max_seqlen, pk.max_seqlen, 0.0,
            deterministic=deterministic, return_attn_probs=True, **options)
    else:
        k_u, v_u = pk.leaf(), pv.leaf()
        leaves = (q_u, k_u, v_u)
        out_u, lse, s_dmask = flash_attn_varlen_func(
            q_u, k_u, v_u, pq.cu_seqlens, pk.cu_seqlens, pq.max_seqlen, pk.max_seqlen, 0.0,
            deterministic=deterministic, return_attn_probs=True, **options)
    total_q = int(pq.cu_seqlens[-1])
    assert out_u.shape == (total_q, NHEADS, d) and out_u.dtype == dtype
    assert lse.shape == (NHEADS, total_q) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,)
    out = pq.pad(out_u)

    lengths = dict(q_lens=pq.lengths, k_lens=pk.lengths)
    out_ref, _, lse_ref = attention_reference(q, k, v, **lengths, **options)
    out_pt, _, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **lengths,
                                       **options)
    assert_rule("out", out, out_ref, out_pt, dtype)
    # lse (H, total_q) against the padded reference's rows of real queries
    lse_ref_packed = lse_ref.permute(0, 2, 1)[pq.mask].permute(1, 0)
    assert_lse(lse, lse_ref_packed)

    g = torch.randn_like(out)
    grads_u = torch.autograd.grad(out, leaves, g)
    dq = pq.pad(grads_u[0])
    if kvpacked:
        dk, dv = pk.pad(grads_u[1][:, 0]), pk.pad(grads_u[1][:, 1])
    else:
        dk, dv = pk.pad(grads_u[1]), pk.pad(grads_u[2])
    grads_ref = grads_of(out_ref, (q, k, v), g)
    grads_pt = grads_of(out_pt, (q, k, v), g)
    for name, got, ref, naive in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref, grads_pt):
        assert_rule(name, got, ref, naive, dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "causal": [False, True], "d": [32, 64, 128],
     "dropout_p": [0.0, DROPOUT_P]},
    {"seqlen": [97, 128, 217]},
))
def test_flash_attn_varlen_qkvpacked(dtype, causal, d, dropout_p, seqlen):
    torch.manual_seed(0)
    batch = 3
    qkv = torch.randn(batch, seqlen, 3, NHEADS, d, dtype=dtype, requires_grad=True)
    packed = Packed(qkv, random_padding_mask(seqlen, batch, "random"))
    qkv_u = packed.leaf()
    out_u, lse, s_dmask = flash_attn_varlen_qkvpacked_func(
        qkv_u, packed.cu_seqlens, packed.max_seqlen, dropout_p, causal=causal,
        return_attn_probs=True)
    total = int(packed.cu_seqlens[-1])
    assert out_u.shape == (total, NHEADS, d) and lse.shape == (NHEADS, total)
    out = packed.pad(out_u)
    q, k, v = qkv.unbind(dim=2)
    lengths = dict(q_lens=packed.lengths, k_lens=packed.lengths)
    keep = None
    if dropout_p > 0.0:
        keep, probs = keep_mask_from_s_dmask(s_dmask, batch, NHEADS, packed.max_seqlen,
                                             packed.max_seqlen, seqlen, seqlen, dtype)
    else:
        assert s_dmask.shape == (0,)
    args = dict(lengths, causal=causal, dropout_p=dropout_p, keep=keep)
    out_ref, probs_ref, _ = attention_reference(q, k, v, **args)
    out_pt, probs_pt, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)
    if dropout_p > 0.0:
        visible, _ = visibility(batch, seqlen, seqlen, causal=causal, **lengths)
        assert_rule("S_dmask probabilities", probs, probs_ref, probs_pt, dtype,
                    where=visible.expand_as(probs))
        assert_dropout_fraction(keep, visible, dropout_p)
    g = torch.randn_like(out)
    (dqkv_u,) = torch.autograd.grad(out, (qkv_u,), g)
    dqkv = packed.pad(dqkv_u)
    (dqkv_ref,) = grads_of(out_ref, (qkv,), g)
    (dqkv_pt,) = grads_of(out_pt, (qkv,), g)
    for i, name in enumerate("qkv"):
        assert_rule(f"d{name}", dqkv[:, :, i], dqkv_ref[:, :, i], dqkv_pt[:, :, i], dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": ["mha", "gqa"], "causal": [False, True]},
    {"shape": [(32, 113, 203), (64, 128, 217), (128, 217, 113)], "kvpacked": [False, True],
     "local": [False, True], "max_seqlen": ["batch's", "padded"]},
))
def test_flash_attn_varlen_dropout(dtype, mha_type, causal, shape, kvpacked, local, max_seqlen):
    """Varlen S_dmask: (batch, nheads, round128(max_seqlen_q), round128(max_seqlen_k)) for the
    max_seqlen_q/k passed (the batch's longest, or the padded length as callers often pass);
    sequence b's probabilities and keep mask in [b, :, :seqlen_q_b, :seqlen_k_b]."""
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 3, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype, requires_grad=True)
    pq = Packed(q, random_padding_mask(seqlen_q, batch, "random"))
    pk = Packed(k, random_padding_mask(seqlen_k, batch, "third"))
    pv = Packed(v, pk.mask)
    window = random_window(seqlen_k) if local else (-1, -1)
    q_u = pq.leaf()
    max_q, max_k = (pq.max_seqlen, pk.max_seqlen) if max_seqlen == "batch's" else (seqlen_q,
                                                                                 seqlen_k)
    lens = (pq.cu_seqlens, pk.cu_seqlens, max_q, max_k)
    if kvpacked:
        kv_u = torch.stack([pk.unpadded, pv.unpadded], dim=1).detach().requires_grad_()
        leaves = (q_u, kv_u)
        out_u, lse, s_dmask = flash_attn_varlen_kvpacked_func(
            q_u, kv_u, *lens, DROPOUT_P, causal=causal, window_size=window,
            return_attn_probs=True)
    else:
        leaves = (q_u, pk.leaf(), pv.leaf())
        out_u, lse, s_dmask = flash_attn_varlen_func(
            *leaves, *lens, DROPOUT_P, causal=causal, window_size=window, return_attn_probs=True)
    out = pq.pad(out_u)
    keep, probs = keep_mask_from_s_dmask(s_dmask, batch, NHEADS, max_q, max_k, seqlen_q,
                                         seqlen_k, dtype)
    lengths = dict(q_lens=pq.lengths, k_lens=pk.lengths)
    args = dict(lengths, causal=causal, window_size=window, dropout_p=DROPOUT_P, keep=keep)
    out_ref, probs_ref, _ = attention_reference(q, k, v, **args)
    out_pt, probs_pt, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)
    visible, _ = visibility(batch, seqlen_q, seqlen_k, causal=causal, window_size=window,
                            **lengths)
    assert_rule("S_dmask probabilities", probs, probs_ref, probs_pt, dtype,
                where=visible.expand_as(probs))
    assert_dropout_fraction(keep, visible, DROPOUT_P)

    g = torch.randn_like(out)
    grads_u = torch.autograd.grad(out, leaves, g)
    if kvpacked:
        dq, dk, dv = pq.pad(grads_u[0]), pk.pad(grads_u[1][:, 0]), pk.pad(grads_u[1][:, 1])
    else:
        dq, dk, dv = pq.pad(grads_u[0]), pk.pad(grads_u[1]), pk.pad(grads_u[2])
    for name, got, ref, naive in zip(("dq", "dk", "dv"), (dq, dk, dv),
                                     grads_of(out_ref, (q, k, v), g),
                                     grads_of(out_pt, (q, k, v), g)):
        assert_rule(name, got, ref, naive, dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": MHA_TYPES, "causal": [False, True],
     "page_size": [16, 256]},
    {"d": [64, 128, 59], "local": [False, True]},
))
def test_flash_attn_varlen_paged(dtype, mha_type, causal, page_size, d, local):
    """flash_attn_varlen_func with block_table: packed queries (each sequence's last tokens)
    against a paged KV cache; cu_seqlens_k gives each sequence's key count."""
    torch.manual_seed(0)
    batch, nheads_k, max_keys = 3, KV_HEADS[mha_type], 300
    k_lens = torch.randint(50, max_keys + 1, (batch,))
    q_lens = torch.minimum(torch.randint(1, 40, (batch,)), k_lens)
    q_lens[0] = 1  # one sequence decodes a single token
    blocks_per_seq = math.ceil(max_keys / page_size)
    num_blocks = batch * blocks_per_seq + 2
    k_pages = torch.randn(num_blocks, page_size, nheads_k, d, dtype=dtype)
    v_pages = torch.randn(num_blocks, page_size, nheads_k, d, dtype=dtype)
    block_table = torch.randperm(num_blocks)[:batch * blocks_per_seq].reshape(batch, -1)
    block_table = block_table.to(torch.int32)
    seqlen_q, seqlen_k = int(q_lens.max()), blocks_per_seq * page_size
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    pq = Packed(q, torch.arange(seqlen_q)[None, :] < q_lens[:, None])
    cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(k_lens, 0), (1, 0)).to(torch.int32)
    window = random_window(int(k_lens.min())) if local else (-1, -1)
    out_u = flash_attn_varlen_func(pq.unpadded, k_pages, v_pages, pq.cu_seqlens, cu_seqlens_k,
                                   pq.max_seqlen, int(k_lens.max()), causal=causal,
                                   window_size=window, block_table=block_table)
    out = pq.pad(out_u)
    k = k_pages[block_table.long()].reshape(batch, seqlen_k, nheads_k, d)
    v = v_pages[block_table.long()].reshape(batch, seqlen_k, nheads_k, d)
    args = dict(q_lens=q_lens, k_lens=k_lens, causal=causal, window_size=window)
    out_ref, _, _ = attention_reference(q, k, v, **args)
    out_pt, _, _ = attention_reference(q, k, v, upcast=False, reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)


# ---- KV cache -------------------------------------------------------------------------------


def rotate_reference(x, cos, sin, positions, interleaved):
    """x (B, S, H, D) rotated in float64 at positions (B, S); cos/sin (S_ro, rotary_dim / 2)."""
    x = x.double()
    rotary_dim = cos.shape[1] * 2
    c = cos.double()[positions][:, :, None, :]
    s = sin.double()[positions][:, :, None, :]
    if interleaved:
        x0, x1 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    else:
        x0, x1 = x[..., :rotary_dim // 2], x[..., rotary_dim // 2:rotary_dim]
    r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
    if interleaved:
        rotated = torch.stack([r0, r1], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([r0, r1], dim=-1)
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES, "mha_type": MHA_TYPES, "causal": [False, True], "local": [False, True],
     "new_kv": [False, True], "paged": [None, 256, 16]},
    {"alibi": [False, True], "leftpad": [False, True], "batch_idx": [False, True],
     "num_splits": [0, 1, 3], "seqlen_new_eq_q": [True, False], "int_seqlens": [False, True],
     "rotary": [(0.0, True), (0.5, True), (1.0, True), (0.5, False), (1.0, False)],
     "shape": [(64, 1, 128), (32, 3, 339), (59, 1, 517), (128, 64, 256), (256, 1, 200),
               (80, 17, 300)]},
))
def test_flash_attn_kvcache(dtype, mha_type, causal, local, new_kv, paged, alibi, leftpad,
                            batch_idx, num_splits, seqlen_new_eq_q, int_seqlens, rotary, shape):
    d, seqlen_q, cache_len = shape
    torch.manual_seed(0)
    batch, nheads_k = 2, KV_HEADS[mha_type]
    rotary_fraction, interleaved = rotary
    if not new_kv:
        rotary_fraction = 0.0  # flash-attn rotates only when new keys are appended
    rotary_dim = int(d * rotary_fraction) // 16 * 16
    leftpad = leftpad and paged is None  # flash-attn: no cache_leftpad with a paged cache
    batch_idx = batch_idx and paged is None
    seqlen_new = 0
    if new_kv:
        seqlen_new = seqlen_q if seqlen_new_eq_q else int(torch.randint(1, seqlen_q + 1, ()))

    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    if paged is None:
        batch_cache = 2 * batch if batch_idx else batch
        k_cache = torch.randn(batch_cache, cache_len, nheads_k, d, dtype=dtype)
        v_cache = torch.randn(batch_cache, cache_len, nheads_k, d, dtype=dtype)
        cache_batch_idx = torch.randperm(batch_cache)[:batch].to(torch.int32) if batch_idx else None
        block_table = None
        rows_of = (cache_batch_idx.long() if batch_idx else torch.arange(batch)).tolist()

        def place(b, pos):  # where position pos of sequence b lives in the raw cache
            return rows_of[b], pos
    else:
        blocks_per_seq = math.ceil(cache_len / paged)
        num_blocks = batch * blocks_per_seq + 3
        k_cache = torch.randn(num_blocks, paged, nheads_k, d, dtype=dtype)
        v_cache = torch.randn(num_blocks, paged, nheads_k, d, dtype=dtype)
        block_table = torch.randperm(num_blocks)[:batch * blocks_per_seq]
        block_table = block_table.reshape(batch, blocks_per_seq).to(torch.int32)
        cache_batch_idx = None

        def place(b, pos):
            return int(block_table[b, pos // paged]), pos % paged

    if int_seqlens:
        cache_seqlens = torch.full((batch,), int(torch.randint(0, cache_len - seqlen_new + 1, ())))
    else:
        cache_seqlens = torch.randint(0, cache_len - seqlen_new + 1, (batch,))
    cache_leftpad = None
    if leftpad:
        cache_leftpad = torch.stack([torch.randint(0, int(n) + 1, ()) for n in cache_seqlens])
    k_new = v_new = cos = sin = None
    if new_kv:
        k_new = torch.randn(batch, seqlen_new, nheads_k, d, dtype=dtype)
        v_new = torch.randn(batch, seqlen_new, nheads_k, d, dtype=dtype)
    if rotary_dim > 0:
        angle = torch.rand(cache_len + seqlen_q, rotary_dim // 2, dtype=torch.float64) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    window = random_window(cache_len) if local else (-1, -1)
    slopes = torch.rand(batch, NHEADS) * 0.3 if alibi else None

    # What the caches must hold afterwards: the new rows (keys rotated at their positions) at
    # cache_seqlens[b] .. + seqlen_new - 1, every other entry untouched.
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    if new_kv:
        positions = cache_seqlens[:, None] + torch.arange(seqlen_new)[None, :]
        k_rows = k_new
        if rotary_dim > 0:
            k_rows = rotate_reference(k_new, cos, sin, positions, interleaved).to(dtype)
        for b in range(batch):
            for t in range(seqlen_new):
                where = place(b, int(positions[b, t]))
                k_expected[where], v_expected[where] = k_rows[b, t], v_new[b, t]
                written[where] = True
    k_storage, v_storage = k_cache.data_ptr(), v_cache.data_ptr()

    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=int(cache_seqlens[0]) if int_seqlens else cache_seqlens.to(torch.int32),
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=None if cache_leftpad is None else cache_leftpad.to(torch.int32),
        block_table=block_table, causal=causal, window_size=window, rotary_interleaved=interleaved,
        alibi_slopes=slopes, num_splits=num_splits, return_softmax_lse=True)

    # the cache tensors themselves were written (in place, same storage)
    assert k_cache.data_ptr() == k_storage and v_cache.data_ptr() == v_storage
    assert torch.equal(k_cache[~written], k_expected[~written])
    assert torch.equal(v_cache, v_expected)
    if rotary_dim > 0:  # rotated once in f32 and rounded: allow one ulp of the dtype
        torch.testing.assert_close(k_cache[written], k_expected[written], atol=1e-6,
                                   rtol=torch.finfo(dtype).eps)
    else:
        assert torch.equal(k_cache, k_expected)

    # attention over each sequence's cache positions [leftpad, cache_seqlens + seqlen_new)
    assert out.shape == (batch, seqlen_q, NHEADS, d) and out.dtype == dtype
    assert lse.shape == (batch, NHEADS, seqlen_q)
    if paged is None:
        k_seq, v_seq = k_expected[rows_of], v_expected[rows_of]
    else:
        k_seq = k_expected[block_table.long()].flatten(1, 2)[:, :cache_len]
        v_seq = v_expected[block_table.long()].flatten(1, 2)[:, :cache_len]
    start = torch.zeros(batch, dtype=torch.long) if cache_leftpad is None else cache_leftpad
    q_exact = q
    if rotary_dim > 0:
        q_offsets = torch.arange(seqlen_q) if (causal or local) else torch.zeros(seqlen_q,
                                                                               dtype=torch.long)
        q_exact = rotate_reference(q, cos, sin, cache_seqlens[:, None] + q_offsets[None, :],
                                   interleaved)
    args = dict(k_lens=cache_seqlens + seqlen_new - start, k_start=start, causal=causal,
                window_size=window, alibi_slopes=slopes)
    out_ref, _, lse_ref = attention_reference(q_exact, k_seq, v_seq, out_dtype=dtype, **args)
    out_pt, _, _ = attention_reference(q_exact.to(dtype), k_seq, v_seq, upcast=False,
                                       reorder_ops=True, **args)
    assert_rule("out", out, out_ref, out_pt, dtype)
    assert_lse(lse, lse_ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_kvcache_decode_loop(dtype):
    """Token-by-token decoding into one preallocated cache equals attention over the prefix."""
    torch.manual_seed(0)
    batch, nheads_k, d, steps = 2, 2, 64, 12
    k_cache = torch.zeros(batch, steps, nheads_k, d, dtype=dtype)
    v_cache = torch.zeros(batch, steps, nheads_k, d, dtype=dtype)
    keys = torch.randn(batch, steps, nheads_k, d, dtype=dtype)
    values = torch.randn(batch, steps, nheads_k, d, dtype=dtype)
    queries = torch.randn(batch, steps, NHEADS, d, dtype=dtype)
    for t in range(steps):
        out = flash_attn_with_kvcache(queries[:, t:t + 1], k_cache, v_cache,
                                      keys[:, t:t + 1], values[:, t:t + 1], cache_seqlens=t,
                                      causal=True)
        assert torch.equal(k_cache[:, :t + 1], keys[:, :t + 1])
        assert torch.equal(v_cache[:, :t + 1], values[:, :t + 1])
        assert not k_cache[:, t + 1:].any()
        expected = flash_attn_func(queries[:, t:t + 1], keys[:, :t + 1], values[:, :t + 1],
                                   causal=True)
        torch.testing.assert_close(out, expected)


# ---- the private functions (ring-flash-attn's building blocks) ------------------------------


def nan_like(x):
    return torch.full_like(x, float("nan"))


def private_options(mod, seqlen_k, batch):
    """(window_left, window_right, softcap, alibi_slopes) for a modifier."""
    if mod == "local":
        return random_window(seqlen_k) + (0.0, None)
    if mod == "softcap":
        return -1, -1, 2.5, None
    if mod == "alibi":
        return -1, -1, 0.0, torch.rand(batch, NHEADS) * 0.3
    return -1, -1, 0.0, None


def assert_close_up_to_out_rounding(got, expected, name):
    """_flash_attn_backward takes out as handed over (delta = <dout, out>, what ring attention
    needs); the autograd formula passes own_forward, under which rows of few keys take delta from
    their own P dP instead (docs/backward.md, "Short rows of the call's own forward"). In f16 and
    bf16 the two then differ by out's rounding: a few units in the last place of the gradient's
    largest element. In f32 that rounding is below the default tolerance."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, msg=lambda m: f"{name}: {m}")
        return
    atol = 4 * torch.finfo(got.dtype).eps * expected.float().abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES + [torch.float32], "causal": [False, True], "mha_type": ["mha", "gqa"],
     "dropout_p": [0.0, DROPOUT_P]},
    {"mod": ["none", "local", "softcap", "alibi"],
     "shape": [(64, 113, 203), (32, 128, 128), (128, 1, 65), (59, 200, 100)]},
))
def test_private_forward_backward_match_autograd(dtype, causal, mha_type, dropout_p, mod, shape):
    """_flash_attn_forward, then _flash_attn_backward into preallocated buffers, equal
    flash_attn_func and autograd (same seed, so the same dropout mask through rng_state)."""
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 2, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype)
    dout = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    wl, wr, softcap, alibi = private_options(mod, seqlen_k, batch)
    scale = 0.9 / math.sqrt(d)

    torch.manual_seed(11)
    out, lse, s_dmask, rng_state = _flash_attn_forward(
        q, k, v, dropout_p, scale, causal, wl, wr, softcap, alibi, dropout_p > 0.0)
    assert out.shape == (batch, seqlen_q, NHEADS, d) and out.dtype == dtype
    assert lse.shape == (batch, NHEADS, seqlen_q) and lse.dtype == torch.float32
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    if dropout_p > 0.0:
        assert s_dmask.shape == (batch, NHEADS, round128(seqlen_q), round128(seqlen_k))
    else:
        assert s_dmask.shape == (0,)

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.manual_seed(11)
    out_auto, lse_auto, s_auto = flash_attn_func(*leaves, dropout_p, scale, causal, (wl, wr),
                                                 softcap, alibi, False, True)
    torch.testing.assert_close(out, out_auto, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_auto, rtol=0, atol=0)
    if dropout_p > 0.0:
        assert torch.equal(s_dmask, s_auto)
    grads = grads_of(out_auto, leaves, dout)

    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    buffers = [x.data_ptr() for x in (dq, dk, dv)]
    softmax_d = _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, dropout_p, scale,
                                     causal, wl, wr, softcap, alibi, False, rng_state)
    assert [x.data_ptr() for x in (dq, dk, dv)] == buffers
    for name, got, expected in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert_close_up_to_out_rounding(got, expected, name)
    assert softmax_d.shape == (batch, NHEADS, round128(seqlen_q))
    assert softmax_d.dtype == torch.float32
    rowsum = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(softmax_d[..., :seqlen_q], rowsum, rtol=1e-5, atol=1e-5)


def merge_by_lse(parts, heads_dim):
    """Combine partial attentions over disjoint keys: [(out, lse)] -> (out float32, lse).
    ``heads_dim`` is where lse's heads axis sits relative to out's (see callers)."""
    lse = parts[0][1]
    for _, part_lse in parts[1:]:
        lse = torch.logaddexp(lse, part_lse)
    out = 0
    for part_out, part_lse in parts:
        weight = torch.exp(part_lse - lse)
        out = out + heads_dim(weight) * part_out.float()
    return out, lse


@pytest.mark.parametrize(*grid(
    {"dtype": [torch.bfloat16, torch.float32], "causal": [False, True], "mha_type": MHA_TYPES},
    {"shape": [(64, 128, 256), (32, 113, 203), (128, 64, 64)], "softcap": [0.0, 2.5]},
))
def test_private_ring_attention_blocks(dtype, causal, mha_type, shape, softcap):
    """Keys split in two blocks: forwards combined by their LSEs give the whole attention, and the
    backward of each block run with the combined out/LSE gives that block's dk/dv, and its share
    of dq (ring attention)."""
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 2, KV_HEADS[mha_type]
    q = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    if softcap:
        q = q * 3
    k = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype)
    dout = torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype)
    scale = d ** -0.5
    split = seqlen_k // 3
    # (first key, end, causal, window): the bottom-right causal mask of the whole attention is,
    # on the first block, a right window reaching seqlen_k - split past that block's diagonal.
    blocks = [(0, split, False, (-1, seqlen_k - split) if causal else (-1, -1)),
              (split, seqlen_k, causal, (-1, -1))]
    parts = []
    for lo, hi, block_causal, (wl, wr) in blocks:
        o, l, _, _ = _flash_attn_forward(q, k[:, lo:hi], v[:, lo:hi], 0.0, scale, block_causal,
                                         wl, wr, softcap, None, False)
        parts.append((o, l))
    out32, lse = merge_by_lse(parts, lambda w: w.transpose(1, 2)[..., None])
    out = out32.to(dtype)

    dq = torch.zeros(batch, seqlen_q, NHEADS, d)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for lo, hi, block_causal, (wl, wr) in blocks:
        dq_block = torch.empty_like(q)
        _flash_attn_backward(dout, q, k[:, lo:hi], v[:, lo:hi], out, lse, dq_block,
                             dk[:, lo:hi], dv[:, lo:hi], 0.0, scale, block_causal, wl, wr,
                             softcap, None, False, None)
        dq += dq_block.float()

    check_ring_result(
        dtype, (out, lse, dq.to(dtype), dk, dv), (q, k, v), dout,
        lambda *x: flash_attn_func(*x, causal=causal, softcap=softcap, return_attn_probs=True)[:2],
        (q, k, v), dict(causal=causal, softcap=softcap))


def check_ring_result(dtype, ring, inputs, dout, whole, padded, ref_args, pad_q=None,
                      pad_k=None, lse_rows=None):
    """The ring's (out, lse, dq, dk, dv) against the whole attention.

    float32: equal to the whole attention's own forward and autograd (``whole(*inputs)`` returns
    its (out, lse)) to 1e-5 of the largest value: the summation order differs, while a wrong mask
    or a lost block would move results by orders of magnitude more.
    bfloat16/float16: the 2x rule against the float64 reference on the ``padded`` (B, S, H, D)
    tensors; ``pad_q``/``pad_k`` map the ring's rows to that layout and ``lse_rows`` the
    reference LSE (B, H, Sq) to the ring's.
    """
    out, lse, dq, dk, dv = ring
    if dtype == torch.float32:
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        out_w, lse_w = whole(*leaves)
        expected = (out_w, lse_w) + tuple(grads_of(out_w, leaves, dout))
        for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), ring, expected):
            atol = 1e-5 * want.abs().max().item()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=atol,
                                       msg=lambda m, n=name: f"ring {n}: {m}")
        return
    pad_q = pad_q or (lambda t: t)
    pad_k = pad_k or (lambda t: t)
    leaves = [x.detach().clone().requires_grad_() for x in padded]
    out_ref, _, lse_ref = attention_reference(*leaves, **ref_args)
    out_pt, _, _ = attention_reference(*leaves, upcast=False, reorder_ops=True, **ref_args)
    assert_rule("ring out", pad_q(out), out_ref, out_pt, dtype)
    assert_lse(lse, lse_ref if lse_rows is None else lse_rows(lse_ref))
    g = pad_q(dout)
    for name, got, ref, naive in zip(("dq", "dk", "dv"), (pad_q(dq), pad_k(dk), pad_k(dv)),
                                     grads_of(out_ref, leaves, g), grads_of(out_pt, leaves, g)):
        assert_rule(f"ring {name}", got, ref, naive, dtype)


@pytest.mark.parametrize(*grid(
    {"dtype": DTYPES + [torch.float32], "causal": [False, True], "mha_type": ["mha", "gqa"],
     "dropout_p": [0.0, DROPOUT_P]},
    {"mod": ["none", "local", "softcap", "alibi"],
     "shape": [(64, 113, 203), (32, 128, 128), (128, 1, 65), (59, 150, 90)]},
))
def test_private_varlen_forward_backward_match_autograd(dtype, causal, mha_type, dropout_p, mod,
                                                        shape):
    d, seqlen_q, seqlen_k = shape
    torch.manual_seed(0)
    batch, nheads_k = 3, KV_HEADS[mha_type]
    pq = Packed(torch.randn(batch, seqlen_q, NHEADS, d, dtype=dtype),
                random_padding_mask(seqlen_q, batch, "random"))
    pk = Packed(torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype),
                random_padding_mask(seqlen_k, batch, "third"))
    pv = Packed(torch.randn(batch, seqlen_k, nheads_k, d, dtype=dtype), pk.mask)
    q, k, v = pq.unpadded, pk.unpadded, pv.unpadded
    total_q = q.shape[0]
    dout = torch.randn(total_q, NHEADS, d, dtype=dtype)
    wl, wr, softcap, alibi = private_options(mod, seqlen_k, batch)
    scale = 1.1 / math.sqrt(d)
    lens = (pq.cu_seqlens, pk.cu_seqlens, pq.max_seqlen, pk.max_seqlen)

    torch.manual_seed(3)
    out, lse, s_dmask, rng_state = _flash_attn_varlen_forward(
        q, k, v, *lens, dropout_p, scale, causal, wl, wr, softcap, alibi, dropout_p > 0.0)
    assert out.shape == (total_q, NHEADS, d) and out.dtype == dtype
    assert lse.shape == (NHEADS, total_q) and lse.dtype == torch.float32
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    if dropout_p > 0.0:
        assert s_dmask.shape == (batch, NHEADS, round128(pq.max_seqlen), round128(pk.max_seqlen))
    else:
        assert s_dmask.shape == (0,)

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.manual_seed(3)
    out_auto, lse_auto, _ = flash_attn_varlen_func(*leaves, *lens, dropout_p, scale, causal,
                                                   (wl, wr), softcap, alibi, False, True)
    torch.testing.assert_close(out, out_auto, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_auto, rtol=0, atol=0)
    grads = grads_of(out_auto, leaves, dout)

    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    softmax_d = _flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, *lens,
                                            dropout_p, scale, causal, wl, wr, softcap, alibi,
                                            False, rng_state)
    for name, got, expected in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert_close_up_to_out_rounding(got, expected, name)
    assert softmax_d.shape == (NHEADS, total_q + 128 * batch)
    rowsum = (dout.float() * out.float()).sum(-1).transpose(0, 1)
    torch.testing.assert_close(softmax_d[:, :total_q], rowsum, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(*grid(
    {"dtype": [torch.bfloat16, torch.float32], "causal": [False, True], "mha_type": MHA_TYPES},
    {"d": [32, 64, 128]},
))
def test_private_varlen_ring_attention_blocks(dtype, causal, mha_type, d):
    """Packed sequences with each sequence's keys split in two blocks (the last ``tail`` keys
    and the rest): LSE-combined forwards and per-block backwards with the combined out/LSE give
    the whole attention and its gradients."""
    torch.manual_seed(0)
    batch, nheads_k, seqlen, tail = 3, KV_HEADS[mha_type], 150, 40
    q_mask = random_padding_mask(seqlen, batch, "random")
    k_mask = random_padding_mask(seqlen, batch, "third")
    k_mask[:, :tail + 1] = True  # every sequence has keys in both blocks
    if causal:
        q_mask = q_mask & k_mask  # no query without a visible key
    pq = Packed(torch.randn(batch, seqlen, NHEADS, d, dtype=dtype), q_mask)
    pk = Packed(torch.randn(batch, seqlen, nheads_k, d, dtype=dtype), k_mask)
    pv = Packed(torch.randn(batch, seqlen, nheads_k, d, dtype=dtype), k_mask)
    q, k, v = pq.unpadded, pk.unpadded, pv.unpadded
    dout = torch.randn_like(q)
    scale = d ** -0.5
    # packed key rows of each block
    starts, lengths = pk.cu_seqlens[:-1].long(), pk.lengths.long()
    head_rows = torch.cat([torch.arange(s, s + n - tail) for s, n in zip(starts, lengths)])
    tail_rows = torch.cat([torch.arange(s + n - tail, s + n) for s, n in zip(starts, lengths)])
    cu_head = torch.nn.functional.pad(torch.cumsum(lengths - tail, 0), (1, 0)).to(torch.int32)
    cu_tail = (torch.arange(batch + 1) * tail).to(torch.int32)
    blocks = [(head_rows, cu_head, int((lengths - tail).max()), False,
               (-1, tail) if causal else (-1, -1)),
              (tail_rows, cu_tail, tail, causal, (-1, -1))]
    parts = []
    for rows, cu_k, max_k, block_causal, (wl, wr) in blocks:
        o, l, _, _ = _flash_attn_varlen_forward(
            q, index_first_axis(k, rows), index_first_axis(v, rows), pq.cu_seqlens, cu_k,
            pq.max_seqlen, max_k, 0.0, scale, block_causal, wl, wr)
        parts.append((o, l))
    out32, lse = merge_by_lse(parts, lambda w: w.transpose(0, 1)[..., None])
    out = out32.to(dtype)

    dq = torch.zeros(q.shape)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for rows, cu_k, max_k, block_causal, (wl, wr) in blocks:
        dq_b = torch.empty_like(q)
        dk_b = torch.empty(len(rows), nheads_k, d, dtype=dtype)
        dv_b = torch.empty(len(rows), nheads_k, d, dtype=dtype)
        _flash_attn_varlen_backward(dout, q, k[rows], v[rows], out, lse, dq_b, dk_b, dv_b,
                                    pq.cu_seqlens, cu_k, pq.max_seqlen, max_k, 0.0, scale,
                                    block_causal, wl, wr, 0.0, None, False, None)
        dq += dq_b.float()
        dk[rows], dv[rows] = dk_b, dv_b

    lens = (pq.cu_seqlens, pk.cu_seqlens, pq.max_seqlen, pk.max_seqlen)
    check_ring_result(
        dtype, (out, lse, dq.to(dtype), dk, dv), (q, k, v), dout,
        lambda *x: flash_attn_varlen_func(*x, *lens, causal=causal, return_attn_probs=True)[:2],
        (pq.padded, pk.padded, pv.padded), dict(q_lens=pq.lengths, k_lens=pk.lengths,
                                                causal=causal),
        pad_q=pq.pad, pad_k=pk.pad,
        lse_rows=lambda lse_ref: lse_ref.permute(0, 2, 1)[pq.mask].permute(1, 0))
