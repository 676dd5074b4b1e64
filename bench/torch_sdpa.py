#!/usr/bin/env python3
"""anyattn against torch.nn.functional.scaled_dot_product_attention on CPU, in the same process.

Runs anyattn_bench's shapes (the forward table, the decode table and the backward table) for each
thread count, with both implementations timed in alternation (warm-up, then rounds of a chunk of
calls of each; the median call of each), prints the ratios as it goes, writes JSON and, when
matplotlib is installed, a PNG of GFLOP/s against sequence length with one line per
implementation.

    python3 bench/torch_sdpa.py --lib build-bench/src/libanyattn.so [--quick] [--threads-list 1,2]

Each implementation gets its own natural layout, outside the timing: anyattn reads (B, S, H, D)
like flash-attn; torch reads (B, H, S, D) contiguous, the layout SDPA is written for. GQA uses
SDPA's enable_gqa where this torch has it; otherwise K and V are expanded with repeat_interleave
inside the timed call, as a user of that torch would have to. torch's is_causal is top-left aligned
and anyattn's causal mask bottom-right aligned; every shape here has Sq == Sk (or Sq = 1 without a
mask), where the two coincide.

Backward rows time anyattn_bwd alone against torch.autograd.grad of SDPA's output alone (with
retain_graph, so every call reuses one recorded forward): each gets out (and anyattn its LSE) from
one untimed forward call, as anyattn_bench's backward table does. GF/s there = 2.5 x the forward's
FLOPs (docs/design.md, section 1); max|diff| compares dq, dk and dv.

With --sweep the script runs the never-slower sweep instead (peer_timing.sweep_shapes: tiny S,
D 1-32 and 257-512, many short varlen sequences) and ends with the worst ratio. torch has no varlen
attention, so its side of a varlen row is what a user writes instead: one SDPA call per sequence,
each on that sequence's own (1, H, S, D) tensors, prepared outside the timing.

If torch is not importable the script says so and exits 0.
"""

import json
import os
import sys
import time

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from anyattn_ctypes import DTYPE_BF16, DTYPE_F32  # noqa: E402
from peer_timing import (decode_shapes, flops, format_row, forward_shapes, matches,  # noqa: E402
                         open_library, peer_parser, print_worst_ratio, record_timings, row_key,
                         sweep_shapes, time_interleaved)
from plot_results import plot_gflops  # noqa: E402


def parse_args():
    parser = peer_parser(__doc__, "torch_sdpa.json")
    parser.add_argument("--no-backward", action="store_true", help="skip the backward shapes")
    parser.add_argument("--png", default=None,
                        help="plot file (default: the JSON path with .png)")
    return parser.parse_args()


def backward_shapes(quick):
    """The backward table of anyattn_bench (S up to 4096): issue 6's bar is >= 2x torch SDPA's
    CPU backward."""
    shapes = []
    for dtype in ("f32", "bf16"):
        for heads_k in ((4,) if quick else (16, 4)):
            for head_dim in (64, 128):
                for causal in (False, True):
                    for seqlen in ((1024, 2048) if quick else (1024, 2048, 4096)):
                        shapes.append(dict(kind="bwd", dtype=dtype, batch=1, seqlen_q=seqlen,
                                           seqlen_k=seqlen, heads_q=16, heads_k=heads_k,
                                           head_dim=head_dim, causal=causal))
    return shapes


def gqa_supported(torch, functional):
    """Whether this torch's SDPA accepts enable_gqa (torch >= 2.5)."""
    q = torch.zeros(1, 4, 2, 8)
    kv = torch.zeros(1, 2, 2, 8)
    try:
        functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def make_torch_call(torch, functional, q, k, v, causal, use_gqa):
    """A zero-argument function running SDPA on (B, H, S, D) tensors; it returns the output."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if use_gqa:
        return lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                               enable_gqa=True)
    return lambda: functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=causal)


def run_row(torch, functional, lib, shape, threads, timing, use_gqa):
    """Times both implementations on one shape; returns the row dict."""
    dtype = torch.float32 if shape["dtype"] == "f32" else torch.bfloat16
    abi_dtype = DTYPE_F32 if shape["dtype"] == "f32" else DTYPE_BF16
    batch, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
    hq, hk, d = shape["heads_q"], shape["heads_k"], shape["head_dim"]
    generator = torch.Generator().manual_seed(1)
    q = (torch.rand(batch, sq, hq, d, generator=generator) * 2 - 1).to(dtype)
    k = (torch.rand(batch, sk, hk, d, generator=generator) * 2 - 1).to(dtype)
    v = (torch.rand(batch, sk, hk, d, generator=generator) * 2 - 1).to(dtype)
    out = torch.zeros(batch, sq, hq, d, dtype=dtype)
    row = dict(shape, key=row_key(shape), threads=threads, flops=flops(shape))
    if shape["kind"] == "decode":
        row["kv_bytes"] = 2 * batch * sk * hk * d * q.element_size()

    anyattn_run = lib.fwd_call(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                               abi_dtype, batch, sq, sk, hq, hk, d, shape["causal"])
    q_t, k_t, v_t = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    torch_run = make_torch_call(torch, functional, q_t, k_t, v_t, shape["causal"], use_gqa)
    torch_out = None
    with torch.inference_mode():
        record_timings(row, time_interleaved([anyattn_run, torch_run], **timing), "torch_sdpa")
        if row["torch_sdpa"]:
            torch_out = torch_run().transpose(1, 2)
    if "speedup_vs_torch_sdpa" in row:
        row["max_abs_diff_vs_torch_sdpa"] = float(
            (out.float() - torch_out.float()).abs().max().item())
    return row


def run_varlen_row(torch, functional, lib, shape, threads, timing, use_gqa):
    """Times one anyattn_fwd_varlen call against one SDPA call per sequence; returns the row."""
    dtype = torch.float32 if shape["dtype"] == "f32" else torch.bfloat16
    abi_dtype = DTYPE_F32 if shape["dtype"] == "f32" else DTYPE_BF16
    hq, hk, d = shape["heads_q"], shape["heads_k"], shape["head_dim"]
    lengths = shape["seqlens"]
    total = sum(lengths)
    generator = torch.Generator().manual_seed(3)
    q = (torch.rand(total, hq, d, generator=generator) * 2 - 1).to(dtype)
    k = (torch.rand(total, hk, d, generator=generator) * 2 - 1).to(dtype)
    v = (torch.rand(total, hk, d, generator=generator) * 2 - 1).to(dtype)
    out = torch.zeros(total, hq, d, dtype=dtype)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    cu_seqlens = torch.tensor(starts, dtype=torch.int32)
    row = dict(shape, key=row_key(shape), threads=threads, flops=flops(shape))

    anyattn_run = lib.fwd_varlen_call(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                      cu_seqlens.data_ptr(), abi_dtype, len(lengths), total,
                                      max(lengths), hq, hk, d, shape["causal"])
    sequences = [tuple(x[a:b].transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
                 for a, b in zip(starts, starts[1:])]
    calls = [make_torch_call(torch, functional, *tensors, shape["causal"], use_gqa)
             for tensors in sequences]

    def torch_run():
        return [call() for call in calls]

    with torch.inference_mode():
        record_timings(row, time_interleaved([anyattn_run, torch_run], **timing), "torch_sdpa")
        if row["torch_sdpa"]:
            torch_out = torch.cat([o[0].transpose(0, 1) for o in torch_run()])
            row["max_abs_diff_vs_torch_sdpa"] = float(
                (out.float() - torch_out.float()).abs().max().item())
    return row


def run_backward_row(torch, functional, lib, shape, threads, timing, use_gqa):
    """Times both backward passes on one shape; returns the row dict."""
    dtype = torch.float32 if shape["dtype"] == "f32" else torch.bfloat16
    abi_dtype = DTYPE_F32 if shape["dtype"] == "f32" else DTYPE_BF16
    batch, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
    hq, hk, d = shape["heads_q"], shape["heads_k"], shape["head_dim"]
    generator = torch.Generator().manual_seed(2)
    q, k, v, dout = ((torch.rand(batch, s, h, d, generator=generator) * 2 - 1).to(dtype)
                     for s, h in ((sq, hq), (sk, hk), (sk, hk), (sq, hq)))
    out = torch.zeros(batch, sq, hq, d, dtype=dtype)
    lse = torch.zeros(batch, hq, sq, dtype=torch.float32)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    row = dict(shape, key=row_key(shape), threads=threads, flops=2.5 * flops(shape))

    lib.fwd_call(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), abi_dtype, batch, sq,
                 sk, hq, hk, d, shape["causal"], lse_ptr=lse.data_ptr())()
    anyattn_run = lib.bwd_call(dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                               out.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                               dv.data_ptr(), abi_dtype, batch, sq, sk, hq, hk, d, shape["causal"])
    q_t, k_t, v_t = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dout_t = dout.transpose(1, 2).contiguous()
    out_t = make_torch_call(torch, functional, q_t, k_t, v_t, shape["causal"], use_gqa)()

    def torch_run():
        return torch.autograd.grad(out_t, (q_t, k_t, v_t), dout_t, retain_graph=True)

    record_timings(row, time_interleaved([anyattn_run, torch_run], **timing), "torch_sdpa")
    if "speedup_vs_torch_sdpa" in row:
        torch_grads = torch_run()
        row["max_abs_diff_vs_torch_sdpa"] = max(
            float((ours.float() - theirs.transpose(1, 2).float()).abs().max().item())
            for ours, theirs in zip((dq, dk, dv), torch_grads))
    return row


def main():
    args = parse_args()
    # torch's OpenMP workers spin on their cores for a while after each parallel region by default,
    # so the anyattn call timed right after a torch call ran on cores they still held: on the
    # 2-core development VM anyattn's f32 B1 H16/4 S2048 rows took 95-106 ms (D64) and 153-195 ms
    # (D128) this way against 58-62 and 106-111 ms with passive waiting, while torch's own times
    # did not get worse (65-67 and 114-149 ms against 71-82 and 123-126). Passive waiting unless
    # the caller chose otherwise; it must be set before torch loads its OpenMP runtime.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError:
        print("torch is not importable in this Python; nothing to compare with. Install torch "
              "(pip install torch) to run this comparison.")
        return 0

    opened = open_library(args)
    if opened is None:
        return 1
    lib, thread_counts, timing = opened
    use_gqa = gqa_supported(torch, functional)
    if args.sweep:
        shapes = sweep_shapes()
    else:
        shapes = (forward_shapes(args.quick)
                  + ([] if args.no_decode else decode_shapes(args.quick))
                  + ([] if args.no_backward else backward_shapes(args.quick)))
    shapes = [s for s in shapes if matches(row_key(s), args.filter)]

    print(f"anyattn {lib.version()} ({lib.path}) vs torch {torch.__version__} SDPA on CPU; "
          f"GQA via {'enable_gqa' if use_gqa else 'repeat_interleave in the timed call'}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print("x torch = torch ms / anyattn ms (>1: anyattn faster); GF/s = 4*B*Hq*D*visible_pairs / "
          "median time (bwd rows: 2.5x that); decode rows show GB/s of K and V; bwd rows time the "
          "backward alone (anyattn_bwd against autograd.grad of SDPA's output)")
    rows = []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        got = lib.set_num_threads(threads)
        print(f"\n{threads} thread(s) (torch {torch.get_num_threads()}, anyattn {got})")
        print(f"{'shape':<26} {'dtype':<5} {'mask':<6} {'thr':>3} | {'anyattn ms':>10} "
              f"{'rate':>12} | {'torch ms':>10} {'rate':>12} | {'x torch':>7} {'max|diff|':>9}")
        for shape in shapes:
            run = {"bwd": run_backward_row, "varlen": run_varlen_row}.get(shape["kind"], run_row)
            row = run(torch, functional, lib, shape, threads, timing, use_gqa)
            rows.append(row)
            print(format_row(row, "torch_sdpa"), flush=True)
    lib.set_num_threads(0)
    print_worst_ratio(rows, "torch_sdpa")

    report = dict(schema="anyattn-torch-sdpa/1",
                  timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  command_line=" ".join(sys.argv), anyattn_library=lib.path,
                  anyattn_version=lib.version(), torch_version=torch.__version__,
                  torch_gqa="enable_gqa" if use_gqa else "repeat_interleave",
                  timing_policy=timing, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"\nJSON: {args.json}")

    panels = {}
    for row in rows:
        if row["kind"] != "fwd":
            continue
        mask = "causal" if row["causal"] else "none"
        name = (f"{row['threads']} thr {row['dtype']} {mask} D{row['head_dim']} "
                f"H{row['heads_q']}/{row['heads_k']}")
        for impl in ("anyattn", "torch_sdpa"):
            result = row.get(impl)
            panels.setdefault(name, {}).setdefault(impl, []).append(
                (row["seqlen_q"], result["gflops"] if result else None))
    if panels:
        plot_gflops(panels, args.png or args.json.rsplit(".", 1)[0] + ".png",
                    f"anyattn vs torch SDPA (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
