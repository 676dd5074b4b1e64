"""``python -m anyattn.bench``: anyattn against torch SDPA on CPU, in one process, same threads.

Rows: the core benchmark's shapes (B=1, Hq=16, Hk in {16, 4}, D in {64, 128}, causal and not,
float32 and bfloat16), S in {512, 1024, 2048} by default or up to 8192 with ``--full``. Columns:
median time and GFLOP/s (forward = 4*B*Hq*D*visible (query, key) pairs) of anyattn, torch SDPA
with its default CPU kernel (flash) and with the math backend, and anyattn's speed-up over each.
Writes JSON (``--json``) and, when matplotlib is installed, a PNG (``--png``, see _bench_plot)
with the f32 FMA peak marked: ``--peak`` (e.g. the one anyattn_bench prints), else the rate of
an f32 torch.mm measured alongside.

``--overhead`` instead measures per-call cost at a one-token decode shape (q (1, 1, 8, 64), k/v
(1, 16, 8, 64)): the C extension alone, the numpy API, the kernel body on torch tensors, the torch
op through the dispatcher, and the torch API (flash_attn_func, flash_attn_with_kvcache over the
same keys as a full cache, flash_attn_varlen_func over them as one sequence, and the FA3 and FA4
call styles), each beside torch SDPA in the same process.

``--fp8`` times FA3's FP8 call style (anyattn.fa3_interface, float8 e4m3 q, k and v with
(batch, nheads_k) descales) beside the same call on the dequantized values in bfloat16 and torch
SDPA on those: prefill (B=1, Hq=16, Hk=4, D=128, causal, S 1024 and 2048) through
flash_attn_func, and decode (B=1, Hq=32, Hk=8, D=128, Sk 4096 and 32768) through
flash_attn_with_kvcache with float8 q against a float8 cache, as sglang's FA3 backend calls it.

``--sparse-mla`` times FA4's top-k sparse absorbed MLA (anyattn.fa4_interface.flash_attn_varlen_func
with gather_kv_indices, called as vLLM's FA4 sparse MLA backend calls it: one query row per
sequence, global rows of a flat bfloat16 latent cache [v | k] of 32768 rows, 512 + 64 columns,
topk 2048) beside what torch offers: gathering each row's keys (index_select), then batched
matmuls and a float32 softmax (torch's SDPA takes seconds here: it expands the one latent head
to every query head). Decode (1 token with 16 heads, as on one of 8 tensor-parallel ranks; 4
tokens with 128 heads) and a prefill chunk (64 tokens, 16 heads). Last column: anyattn over the same keys copied out beforehand into a contiguous
cache (copy not timed), the gather's own cost being the difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Callable, Dict, List

import anyattn
from anyattn._bench_plot import save_plot


def _median_seconds(fn: Callable[[], object], min_time: float = 0.3, max_runs: int = 20) -> float:
    fn()
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _interleaved_medians(fns, min_time: float = 1.0, max_rounds: int = 15) -> List[float]:
    """Median seconds of each of ``fns``, timed in alternation (a round calls each once), so that
    a busy minute on a shared machine slows all of them alike."""
    for fn in fns:
        fn()
    times: List[List[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < 5 or (time.perf_counter() - start < min_time
                                and len(times[0]) < max_rounds):
        for fn, record in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            record.append(time.perf_counter() - t0)
    return [statistics.median(record) for record in times]


def _visible_pairs(s: int, causal: bool) -> int:
    return s * (s + 1) // 2 if causal else s * s


def run_table(full: bool) -> List[Dict[str, object]]:
    """Benchmark every row and return them as dicts (also printed as a table)."""
    import torch  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    torch.set_num_threads(anyattn.get_num_threads())
    lengths = [512, 1024, 2048, 4096, 8192] if full else [512, 1024, 2048]
    rows = []
    header = (f"{'dtype':8} {'Hk':>3} {'D':>4} {'mask':7} {'S':>5} | {'anyattn ms':>10} {'GF/s':>7} | "
              f"{'sdpa ms':>9} {'GF/s':>7} {'x':>5} | {'math ms':>9} {'GF/s':>7} {'x':>5}")
    print(f"threads={anyattn.get_num_threads()} isa={anyattn.isa()} torch={torch.__version__}")
    print(header)
    print("-" * len(header))
    for dtype in (torch.float32, torch.bfloat16):
        for hk in (16, 4):
            for d in (64, 128):
                for causal in (False, True):
                    for s in lengths:
                        q = torch.randn(1, s, 16, d, dtype=dtype)
                        k = torch.randn(1, s, hk, d, dtype=dtype)
                        v = torch.randn(1, s, hk, d, dtype=dtype)
                        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                        flops = 4 * 16 * d * _visible_pairs(s, causal)

                        def sdpa():
                            return torch.nn.functional.scaled_dot_product_attention(
                                qt, kt, vt, is_causal=causal, enable_gqa=hk != 16)

                        with torch.no_grad():
                            t_any = _median_seconds(lambda: anyattn.flash_attn_func(q, k, v, causal=causal))
                            t_sdpa = _median_seconds(sdpa)
                            if s <= 2048:
                                with sdpa_kernel(SDPBackend.MATH):
                                    t_math = _median_seconds(sdpa, max_runs=5)
                            else:
                                t_math = float("nan")
                        row = dict(dtype=str(dtype).replace("torch.", ""), hq=16, hk=hk, d=d,
                                   causal=causal, s=s, anyattn_s=t_any, sdpa_s=t_sdpa, math_s=t_math,
                                   anyattn_gflops=flops / t_any / 1e9, sdpa_gflops=flops / t_sdpa / 1e9,
                                   math_gflops=flops / t_math / 1e9)
                        rows.append(row)
                        print(f"{row['dtype']:8} {hk:>3} {d:>4} {'causal' if causal else 'full':7} {s:>5} | "
                              f"{t_any * 1e3:>10.2f} {row['anyattn_gflops']:>7.1f} | "
                              f"{t_sdpa * 1e3:>9.2f} {row['sdpa_gflops']:>7.1f} {t_sdpa / t_any:>5.2f} | "
                              f"{t_math * 1e3:>9.2f} {row['math_gflops']:>7.1f} {t_math / t_any:>5.2f}",
                              flush=True)
    return rows


def gemm_rate_gflops() -> float:
    """f32 rate of a 1024-cube torch.mm on anyattn's threads (best of 5): a stand-in for the FMA
    ceiling when ``--peak`` is not given (a GEMM reaches most of it)."""
    import torch  # noqa: PLC0415

    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    best = min(_median_seconds(lambda: torch.mm(a, b), max_runs=5) for _ in range(5))
    return 2 * 1024**3 / best / 1e9


def run_overhead() -> Dict[str, float]:
    """Per-call microseconds at a one-token decode shape, q (1, 1, 8, 64) against k/v
    (1, 16, 8, 64): medians of 15 repeats of 2000 calls, each row beside torch SDPA's on the same
    tensors (SDPA takes heads first; the transposes are made once, outside the timing)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from anyattn import _core, fa3_interface, fa4_interface  # noqa: PLC0415
    from anyattn._cpu import torch_forward  # noqa: PLC0415
    from anyattn._kernel_options import KernelOptions, binding_options  # noqa: PLC0415

    def median_us(fn):
        for _ in range(200):
            fn()
        return statistics.median(timeit.repeat(fn, number=2000, repeat=15)) / 2000 * 1e6

    rng = np.random.default_rng(0)
    qa = rng.standard_normal((1, 1, 8, 64)).astype(np.float32)
    ka = rng.standard_normal((1, 16, 8, 64)).astype(np.float32)
    va = rng.standard_normal((1, 16, 8, 64)).astype(np.float32)
    out, lse = np.empty_like(qa), np.empty((1, 8, 1), np.float32)
    q, k, v = (torch.from_numpy(x) for x in (qa, ka, va))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    plain = KernelOptions()
    no_tensors = binding_options(plain, lambda x: None)
    packed = [x[0] for x in (q, k, v)]  # one sequence, (tokens, heads, D)
    cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 16], dtype=torch.int32)
    rows = {
        "C extension (_core.fwd, numpy buffers)": lambda: _core.fwd(qa, ka, va, out, lse,
                                                                    no_tensors),
        "anyattn.flash_attn_func (numpy)": lambda: anyattn.flash_attn_func(qa, ka, va),
        "kernel body on torch tensors (no dispatcher)": lambda: torch_forward(q, k, v, plain),
        "torch.ops.anyattn.fwd (through the dispatcher)": lambda: torch.ops.anyattn.fwd(
            q, k, v, *plain),
        "anyattn.flash_attn_func (torch)": lambda: anyattn.flash_attn_func(q, k, v),
        "anyattn.flash_attn_with_kvcache (torch)": lambda: anyattn.flash_attn_with_kvcache(
            q, k, v),
        "anyattn.flash_attn_varlen_func (torch)": lambda: anyattn.flash_attn_varlen_func(
            *packed, cu_q, cu_k, 1, 16),
        "fa3_interface.flash_attn_func (torch)": lambda: fa3_interface.flash_attn_func(q, k, v),
        "fa3_interface.flash_attn_with_kvcache (torch)":
            lambda: fa3_interface.flash_attn_with_kvcache(q, k, v),
        "fa4_interface.flash_attn_func (torch)": lambda: fa4_interface.flash_attn_func(q, k, v),
    }
    sdpa = torch.nn.functional.scaled_dot_product_attention
    results = {}
    print(f"{'per call, threads=' + str(anyattn.get_num_threads()):48} {'us':>8} {'SDPA us':>8} "
          f"{'x SDPA':>7}")
    for name, fn in rows.items():
        ours, theirs = median_us(fn), median_us(lambda: sdpa(qt, kt, vt))
        results[name] = ours
        results[name + " / torch SDPA"] = ours / theirs
        print(f"{name:48} {ours:8.2f} {theirs:8.2f} {ours / theirs:7.2f}")
    return results


def run_fp8() -> List[Dict[str, object]]:
    """FA3's FP8 call style against bfloat16 on the same (dequantized) values and torch SDPA;
    medians, in one process on anyattn's threads (module docstring)."""
    import torch  # noqa: PLC0415

    from anyattn import fa3_interface  # noqa: PLC0415

    torch.set_num_threads(anyattn.get_num_threads())
    f8 = torch.float8_e4m3fn
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    print(f"threads={anyattn.get_num_threads()} isa={anyattn.isa()} torch={torch.__version__}")
    print(f"{'call':9} {'shape':28} | {'fp8 ms':>8} {'bf16 ms':>8} {'bf16/fp8':>8} | "
          f"{'sdpa ms':>8} {'sdpa/fp8':>8}")

    def quantized(shape, hk):
        """(float8 values, (1, hk) descale, the dequantized values in bfloat16) of random values
        of shape (1, S, H, D), one descale per kv head (its group of H / hk heads)."""
        x = torch.randn(shape)
        group = shape[2] // hk
        descale = x.abs().amax(dim=(0, 1, 3)).reshape(hk, group).amax(dim=1).reshape(1, hk) / 448
        per_head = descale.repeat_interleave(group, dim=1)[:, None, :, None]
        x8 = (x / per_head).to(f8)
        return x8, descale, (x8.float() * per_head).to(torch.bfloat16)

    def report(call, shape, fn8, fn16, fn_sdpa, flops=None):
        with torch.no_grad():
            t8, t16, ts = _interleaved_medians((fn8, fn16, fn_sdpa))
        row = dict(call=call, shape=shape, fp8_s=t8, bf16_s=t16, sdpa_s=ts)
        if flops is not None:
            row["fp8_gflops"] = flops / t8 / 1e9
        rows.append(row)
        print(f"{call:9} {shape:28} | {t8 * 1e3:8.3f} {t16 * 1e3:8.3f} {t16 / t8:8.2f} | "
              f"{ts * 1e3:8.3f} {ts / t8:8.2f}", flush=True)

    for s in (1024, 2048):
        (q8, qd, q), (k8, kd, k), (v8, vd, v) = (quantized((1, s, h, 128), 4)
                                                 for h in (16, 4, 4))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        report("prefill", f"Hq16/Hk4 D128 S{s} causal",
               lambda: fa3_interface.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd,
                                                     k_descale=kd, v_descale=vd),
               lambda: fa3_interface.flash_attn_func(q, k, v, causal=True),
               lambda: sdpa(qt, kt, vt, is_causal=True, enable_gqa=True),
               4 * 16 * 128 * s * (s + 1) // 2)
    for sk in (4096, 32768):
        (k8, kd, k), (v8, vd, v) = (quantized((1, sk, 8, 128), 8) for _ in range(2))
        q = torch.randn(1, 1, 32, 128).to(torch.bfloat16)
        q8 = q.to(f8)
        qt, kt, vt = (x.transpose(1, 2) for x in (q8.to(torch.bfloat16), k, v))
        report("decode", f"Hq32/Hk8 D128 Sk{sk}",
               lambda: fa3_interface.flash_attn_with_kvcache(q8, k8, v8, k_descale=kd,
                                                             v_descale=vd),
               lambda: fa3_interface.flash_attn_with_kvcache(q, k, v),
               lambda: sdpa(qt, kt, vt, enable_gqa=True))
    return rows


def run_sparse_mla() -> List[Dict[str, object]]:
    """FA4's top-k sparse MLA against torch's gather + matmuls; medians, in one process on
    anyattn's threads (module docstring)."""
    import torch  # noqa: PLC0415

    from anyattn import fa4_interface  # noqa: PLC0415

    torch.set_num_threads(anyattn.get_num_threads())
    rows, n_rows, topk, latent, rope = [], 32768, 2048, 512, 64
    scale = (latent + rope) ** -0.5
    cache = torch.randn(n_rows, 1, latent + rope).to(torch.bfloat16)
    print(f"threads={anyattn.get_num_threads()} isa={anyattn.isa()} torch={torch.__version__}")
    print(f"{'call':8} {'shape':26} | {'anyattn ms':>10} {'GFLOP/s':>8} | {'torch ms':>9} "
          f"{'torch/anyattn':>13} | {'pre-gathered':>12}")
    for call, tokens, heads in (("decode", 1, 16), ("decode", 4, 128), ("prefill", 64, 16)):
        g = torch.Generator().manual_seed(tokens)
        idx = torch.stack([torch.randperm(n_rows, generator=g)[:topk] for _ in range(tokens)])
        idx = idx.to(torch.int32)
        q_nope = torch.randn(tokens, heads, latent).to(torch.bfloat16)
        q_pe = torch.randn(tokens, heads, rope).to(torch.bfloat16)
        cu_q = torch.arange(tokens + 1, dtype=torch.int32)

        def ours():
            return fa4_interface.flash_attn_varlen_func(
                q_pe, cache[..., latent:], cache[..., :latent], q_nope, cu_seqlens_q=cu_q,
                cu_seqlens_k=torch.zeros_like(cu_q), max_seqlen_q=1, max_seqlen_k=n_rows,
                seqused_k=torch.full((tokens,), n_rows, dtype=torch.int32),
                gather_kv_indices=idx, softmax_scale=scale)[0]

        q_wide = torch.cat([q_nope, q_pe], -1)  # (tokens, heads, 576)

        def gather_matmul():
            keys = cache[:, 0].index_select(0, idx.reshape(-1).long())
            keys = keys.reshape(tokens, topk, latent + rope)
            scores = torch.matmul(q_wide, keys.transpose(1, 2)).float() * scale
            probs = torch.softmax(scores, -1).to(torch.bfloat16)
            return torch.matmul(probs, keys[..., :latent])

        gathered = cache[:, 0].index_select(0, idx.reshape(-1).long())
        gathered = gathered.reshape(tokens, topk, 1, latent + rope)

        def pre_gathered():  # the same attention over keys copied out beforehand
            return anyattn.flash_attn_with_kvcache(q_wide[:, None], gathered,
                                                   gathered[..., :latent], softmax_scale=scale)

        with torch.no_grad():
            t_ours, t_torch, t_copy = _interleaved_medians((ours, gather_matmul, pre_gathered))
        flops = 2 * tokens * heads * topk * (2 * latent + rope)
        rows.append(dict(call=call, tokens=tokens, heads=heads, topk=topk, anyattn_s=t_ours,
                         torch_s=t_torch, pre_gathered_s=t_copy,
                         anyattn_gflops=flops / t_ours / 1e9))
        print(f"{call:8} {f'T{tokens} H{heads} topk{topk}':26} | {t_ours * 1e3:10.3f} "
              f"{flops / t_ours / 1e9:8.1f} | {t_torch * 1e3:9.3f} {t_torch / t_ours:13.2f} | "
              f"{t_copy * 1e3:12.3f}", flush=True)
    return rows


def main() -> None:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="S up to 8192 (slow on 2 cores)")
    parser.add_argument("--overhead", action="store_true", help="per-call overhead at a decode shape, beside torch SDPA")
    parser.add_argument("--fp8", action="store_true",
                        help="FA3's FP8 call style beside bfloat16 and torch SDPA")
    parser.add_argument("--sparse-mla", action="store_true",
                        help="FA4's top-k sparse MLA beside torch's gather + matmuls")
    parser.add_argument("--json", default="anyattn_python_bench.json", help="JSON output path")
    parser.add_argument("--png", default="anyattn_python_bench.png", help="PNG plot path")
    parser.add_argument("--peak", type=float, default=None,
                        help="f32 FMA peak in GFLOP/s to mark on the plot (default: measure an f32 "
                             "torch.mm alongside and mark its rate)")
    args = parser.parse_args()
    if args.overhead:
        result = {"overhead_us": run_overhead()}
    elif args.fp8:
        result = {"threads": anyattn.get_num_threads(), "isa": anyattn.isa(), "fp8": run_fp8()}
    elif args.sparse_mla:
        result = {"threads": anyattn.get_num_threads(), "isa": anyattn.isa(),
                  "sparse_mla": run_sparse_mla()}
    else:
        rows = run_table(args.full)
        if args.peak is not None:
            peak, peak_label = args.peak, "f32 FMA peak"
        else:
            peak, peak_label = gemm_rate_gflops(), "f32 torch.mm rate"
        result = {"threads": anyattn.get_num_threads(), "isa": anyattn.isa(), "rows": rows,
                  "peak_gflops": peak, "peak_label": peak_label}
        if save_plot(rows, args.png, peak, peak_label):
            print(f"plot: {args.png}")
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
