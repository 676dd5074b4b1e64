#!/usr/bin/env python3
"""anyattn against ggml's flash attention (ggml_flash_attn_ext, the CPU kernel llama.cpp runs), in
the same process.

Runs anyattn_bench's forward and decode shapes for each thread count and each dtype of the K/V
cache, with both implementations timed in alternation (peer_timing.time_interleaved: warm-up,
then rounds of a chunk of calls of each; the median call of each), prints the ratios as it goes
and writes JSON.

    python3 bench/ggml_fa.py --lib build-bench/src/libanyattn.so [--quick] [--threads-list 1,2]
                             [--dtypes f32,f16,bf16] [--filter TERMS] [--no-decode]

ggml is reached through the ggml-python package (its ctypes bindings to the libggml it builds
from source for this CPU; scripts/setup.sh installs it into .venv). How each side is called:

- ggml: one graph holding ggml_flash_attn_ext, built once per row; the timed call is
  ggml_graph_compute with a persistent ggml thread pool of the row's thread count, passive
  (poll = 0: its workers sleep between calls, as anyattn's do, so neither steals the other's
  cores). q is f32 (ggml's flash attention takes no other q type) holding the row dtype's values;
  K and V are in the row's dtype, f16 being llama.cpp's default cache type. Layout (B, H, S, D),
  ggml's natural one; the causal mask is ggml's f16 mask tensor (0 or -inf per query and key),
  which is how llama.cpp asks for it.
- anyattn: anyattn_fwd through bench/anyattn_ctypes.py on (B, S, H, D) buffers of the row's dtype
  (q included), with the causal flag.
Both get the same values. `max|diff|` compares the outputs (ggml writes f32; anyattn the row's
dtype). ggml converts q to the K type for its dot products and, for f16 V, accumulates the output
in f16, so its f16 rows differ from anyattn's by more than rounding.

With --sweep the script runs the never-slower sweep's dense shapes instead
(peer_timing.sweep_shapes: tiny S, D 1-32 and 257-512; ggml has no varlen call) and ends with the
worst ratio.

If ggml-python is not importable the script says so and exits 0.
"""

import ctypes
import json
import os
import sys
import time

import numpy as np

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from anyattn_ctypes import DTYPE_BF16, DTYPE_F16, DTYPE_F32  # noqa: E402
from peer_timing import (decode_shapes, flops, format_row, forward_shapes, matches,  # noqa: E402
                         open_library, peer_parser, print_worst_ratio, record_timings, row_key,
                         sweep_shapes, time_interleaved)

ABI_DTYPES = {"f32": DTYPE_F32, "f16": DTYPE_F16, "bf16": DTYPE_BF16}


def parse_args():
    parser = peer_parser(__doc__, "ggml_fa.json")
    parser.add_argument("--dtypes", default="f32,f16",
                        help="K/V dtypes, comma-separated, of f32, f16, bf16 (default f32,f16)")
    args = parser.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in args.dtypes if d not in ABI_DTYPES]
    if unknown or not args.dtypes:
        parser.error(f"--dtypes: {','.join(unknown) or 'nothing'} given; "
                     "choose from f32, f16, bf16")
    return args


def bf16_bits(values):
    """The bf16 bit patterns (uint16) of f32 values, rounded to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits):
    """The f32 values of bf16 bit patterns."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def random_tensor(rng, shape, dtype):
    """Uniform values in [-1, 1) rounded to `dtype`: (the array anyattn reads, their f32 values).
    bf16 arrays are uint16 bit patterns."""
    values = rng.random(shape, dtype=np.float32) * 2 - 1
    if dtype == "f32":
        return values, values
    if dtype == "f16":
        half = values.astype(np.float16)
        return half, half.astype(np.float32)
    bits = bf16_bits(values)
    return bits, bf16_values(bits)


class GgmlAttention:
    """One ggml_flash_attn_ext graph with its tensors, a passive thread pool and a compute plan."""

    TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16"}

    def __init__(self, ggml, shape, q_values, k_data, v_data, threads):
        """q_values: f32 (B, Hq, Sq, D); k_data, v_data: (B, Hk, Sk, D) in the row's dtype (bf16 as
        uint16 bits). Copies them into the graph's tensors."""
        self.ggml = ggml
        batch, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
        hq, hk, d = shape["heads_q"], shape["heads_k"], shape["head_dim"]
        kv_type = getattr(ggml, self.TYPES[shape["dtype"]])
        data_bytes = q_values.nbytes + k_data.nbytes + v_data.nbytes + batch * sq * hq * d * 4
        if shape["causal"]:
            data_bytes += sq * sk * 2
        mem_size = (data_bytes + 16 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead()
                    + (1 << 20))
        params = ggml.ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=False)
        self.ctx = ggml.ggml_init(params)
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate {mem_size} bytes")
        q = ggml.ggml_new_tensor_4d(self.ctx, ggml.GGML_TYPE_F32, d, sq, hq, batch)
        k = ggml.ggml_new_tensor_4d(self.ctx, kv_type, d, sk, hk, batch)
        v = ggml.ggml_new_tensor_4d(self.ctx, kv_type, d, sk, hk, batch)
        for tensor, array in ((q, q_values), (k, k_data), (v, v_data)):
            ctypes.memmove(ggml.ggml_get_data(tensor), array.ctypes.data, array.nbytes)
        mask = None
        if shape["causal"]:
            mask = ggml.ggml_new_tensor_4d(self.ctx, ggml.GGML_TYPE_F16, sk, sq, 1, 1)
            rows = np.arange(sq)[:, None]
            keys = np.arange(sk)[None, :]
            visible = keys <= rows + sk - sq  # bottom-right aligned, as anyattn's causal flag
            mask_values = np.where(visible, 0.0, -np.inf).astype(np.float16)
            ctypes.memmove(ggml.ggml_get_data(mask), mask_values.ctypes.data, mask_values.nbytes)
        self.out = ggml.ggml_flash_attn_ext(self.ctx, q, k, v, mask, 1.0 / np.sqrt(d), 0.0, 0.0)
        self.out_shape = (batch, sq, hq, d)  # ggml's result is [D, Hq, Sq, B]
        self.graph = ggml.ggml_new_graph(self.ctx)
        ggml.ggml_build_forward_expand(self.graph, self.out)
        pool_params = ggml.ggml_threadpool_params_default(threads)
        pool_params.poll = 0
        self.pool = ggml.ggml_threadpool_new(ctypes.byref(pool_params))
        self.plan = ggml.ggml_graph_plan(self.graph, threads, self.pool)
        self.work = (ctypes.c_uint8 * max(1, self.plan.work_size))()
        self.plan.work_data = ctypes.cast(self.work, ctypes.POINTER(ctypes.c_uint8))

    def run(self):
        status = self.ggml.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned status {status}")

    def output(self):
        """The result as an f32 (B, Sq, Hq, D) array (a copy)."""
        pointer = ctypes.cast(self.ggml.ggml_get_data(self.out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(pointer, shape=self.out_shape).copy()

    def close(self):
        self.ggml.ggml_threadpool_free(self.pool)
        self.ggml.ggml_free(self.ctx)


def run_row(ggml, lib, shape, threads, timing):
    """Times both implementations on one shape; returns the row dict."""
    dtype = shape["dtype"]
    batch, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
    hq, hk, d = shape["heads_q"], shape["heads_k"], shape["head_dim"]
    rng = np.random.default_rng(1)
    q, q_values = random_tensor(rng, (batch, sq, hq, d), dtype)
    k, _ = random_tensor(rng, (batch, sk, hk, d), dtype)
    v, _ = random_tensor(rng, (batch, sk, hk, d), dtype)
    out = np.zeros((batch, sq, hq, d), dtype=q.dtype)
    row = dict(shape, key=row_key(shape), threads=threads, flops=flops(shape))
    if shape["kind"] == "decode":
        row["kv_bytes"] = 2 * batch * sk * hk * d * k.itemsize

    def head_major(array):
        return np.ascontiguousarray(array.transpose(0, 2, 1, 3))

    peer = GgmlAttention(ggml, shape, head_major(q_values), head_major(k), head_major(v), threads)
    try:
        anyattn_run = lib.fwd_call(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data,
                                   ABI_DTYPES[dtype], batch, sq, sk, hq, hk, d, shape["causal"])
        record_timings(row, time_interleaved([anyattn_run, peer.run], **timing), "ggml")
        if "speedup_vs_ggml" in row:
            ours = bf16_values(out) if dtype == "bf16" else out.astype(np.float32)
            row["max_abs_diff_vs_ggml"] = float(np.abs(ours - peer.output()).max())
    finally:
        peer.close()
    return row


def main():
    args = parse_args()
    try:
        import ggml
    except ImportError:
        print("ggml-python is not importable in this Python; nothing to compare with. Install it "
              "(pip install ggml-python, which builds ggml for this CPU) to run this comparison.")
        return 0

    opened = open_library(args)
    if opened is None:
        return 1
    lib, thread_counts, timing = opened
    if args.sweep:
        shapes = sweep_shapes(args.dtypes, varlen=False)
    else:
        shapes = forward_shapes(args.quick, args.dtypes)
        if not args.no_decode:
            shapes += decode_shapes(args.quick, args.dtypes)
    shapes = [s for s in shapes if matches(row_key(s), args.filter)]

    features = ", ".join(name for name, probe in (("avx2", ggml.ggml_cpu_has_avx2),
                                                  ("avx512", ggml.ggml_cpu_has_avx512),
                                                  ("avx512_bf16", ggml.ggml_cpu_has_avx512_bf16))
                         if probe())
    print(f"anyattn {lib.version()} ({lib.path}) vs ggml_flash_attn_ext (ggml-python's libggml, "
          f"built with: {features or 'no AVX'}); ggml thread pool passive (poll 0)")
    print("x ggml = ggml ms / anyattn ms (>1: anyattn faster); GF/s = 4*B*Hq*D*visible_pairs / "
          "median time; decode rows show GB/s of K and V; ggml's q is f32 holding the row "
          "dtype's values, its K/V in the row dtype")
    rows = []
    for threads in thread_counts:
        got = lib.set_num_threads(threads)
        print(f"\n{threads} thread(s) (ggml {threads}, anyattn {got})")
        print(f"{'shape':<26} {'dtype':<5} {'mask':<6} {'thr':>3} | {'anyattn ms':>10} "
              f"{'rate':>12} | {'ggml ms':>10} {'rate':>12} | {'x ggml':>7} {'max|diff|':>9}")
        for shape in shapes:
            row = run_row(ggml, lib, shape, threads, timing)
            rows.append(row)
            print(format_row(row, "ggml"), flush=True)
    lib.set_num_threads(0)
    print_worst_ratio(rows, "ggml")

    report = dict(schema="anyattn-ggml-fa/1",
                  timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  command_line=" ".join(sys.argv), anyattn_library=lib.path,
                  anyattn_version=lib.version(), ggml_cpu_features=features,
                  timing_policy=timing, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
