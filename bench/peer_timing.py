"""What the peer comparisons in bench/ share: anyattn_bench's shapes and row keys, FLOP counts,
the alternating timer, the rows' figures and table lines, and the common options and set-up.

torch_sdpa.py (torch's scaled_dot_product_attention) and ggml_fa.py (ggml's flash attention, the
kernel of llama.cpp) time anyattn and the peer on the same shapes, in alternation, by the rules of
anyattn_bench's forward table (bench/timing.h), so that their ratios are taken in one process and
one moment of a shared host.
"""

import argparse
import math
import os
import statistics
import sys
import time

from anyattn_ctypes import AnyattnLibrary, find_library


def forward_shapes(quick, dtypes=("f32", "bf16")):
    """The forward table of anyattn_bench (bench/shapes.cc), as dicts, for each of `dtypes`."""
    shapes = []
    for dtype in dtypes:
        for heads_k in ((4,) if quick else (16, 4)):
            for head_dim in (64, 128):
                for causal in (False, True):
                    for seqlen in ((1024, 2048) if quick else (512, 1024, 2048, 4096, 8192)):
                        shapes.append(dict(kind="fwd", dtype=dtype, batch=1, seqlen_q=seqlen,
                                           seqlen_k=seqlen, heads_q=16, heads_k=heads_k,
                                           head_dim=head_dim, causal=causal))
    return shapes


def decode_shapes(quick, dtypes=("bf16", "f32")):
    """The decode table of anyattn_bench: Sq = 1, Hq = 32, Hk = 8, D = 128, for each of `dtypes`."""
    shapes = []
    for dtype in dtypes:
        for batch in ((1,) if quick else (1, 8)):
            for seqlen_k in (4096, 32768):
                shapes.append(dict(kind="decode", dtype=dtype, batch=batch, seqlen_q=1,
                                   seqlen_k=seqlen_k, heads_q=32, heads_k=8, head_dim=128,
                                   causal=False))
    return shapes


def varlen_lengths(count):
    """`count` sequence lengths spread over 8-128 tokens in a fixed scrambled order."""
    return [8 + (37 * i) % 121 for i in range(count)]


def sweep_shapes(dtypes=("f32", "bf16"), varlen=True):
    """The never-slower sweep (issue 35): shapes where fixed costs, padding and short loops weigh
    more than the FMA peak. Tiny sequences (S 16-256 at D 64 and 128, B1 H8), head dims of 1-32
    and above 256 (S 256 and 1024, B1 H8), and, with `varlen`, one varlen batch of 64 sequences of
    8-128 tokens (H8, D 64 and 128); every shape causal and not, for each of `dtypes`."""
    shapes = []

    def dense(dtype, seqlen, head_dim, causal):
        return dict(kind="fwd", dtype=dtype, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=8,
                    heads_k=8, head_dim=head_dim, causal=causal)

    for dtype in dtypes:
        for causal in (False, True):
            shapes += [dense(dtype, s, d, causal) for s in (16, 64, 256) for d in (64, 128)]
            shapes += [dense(dtype, s, d, causal) for d in (1, 8, 16, 32, 257, 320, 512)
                       for s in (256, 1024)]
            if varlen:
                lengths = varlen_lengths(64)
                shapes += [dict(kind="varlen", dtype=dtype, batch=len(lengths),
                                seqlen_q=max(lengths), seqlen_k=max(lengths), seqlens=lengths,
                                heads_q=8, heads_k=8, head_dim=d, causal=causal) for d in (64, 128)]
    return shapes


def row_key(shape):
    """The row key anyattn_bench uses for the same shape (what --filter matches)."""
    if shape["kind"] == "decode":
        return (f"decode/{shape['dtype']}/B{shape['batch']}/Hq{shape['heads_q']}"
                f"/Hk{shape['heads_k']}/D{shape['head_dim']}/Sk{shape['seqlen_k']}")
    mask = "causal" if shape["causal"] else "full"
    if shape["kind"] == "varlen":
        return (f"varlen/{shape['dtype']}/{mask}/B{shape['batch']}/Hq{shape['heads_q']}"
                f"/Hk{shape['heads_k']}/D{shape['head_dim']}/Smax{shape['seqlen_q']}")
    return (f"{shape['kind']}/{shape['dtype']}/{mask}/B{shape['batch']}/Hq{shape['heads_q']}"
            f"/Hk{shape['heads_k']}/D{shape['head_dim']}/S{shape['seqlen_q']}")


def matches(key, filters):
    """True when `filters` is empty or, for one of them, every comma-separated term occurs in key."""
    if not filters:
        return True
    return any(all(term in key for term in text.split(",") if term) for text in filters)


def visible_pairs(seqlen_q, seqlen_k, causal):
    """Query-key pairs left visible by the bottom-right aligned causal mask (or all of them)."""
    if not causal:
        return seqlen_q * seqlen_k
    return sum(min(max(i + seqlen_k - seqlen_q + 1, 0), seqlen_k) for i in range(seqlen_q))


def flops(shape):
    """Forward FLOPs (docs/design.md, section 1): 4 * B * Hq * D * visible pairs (summed over the
    sequences of a varlen shape)."""
    if shape["kind"] == "varlen":
        return 4.0 * shape["heads_q"] * shape["head_dim"] * sum(
            visible_pairs(n, n, shape["causal"]) for n in shape["seqlens"])
    return 4.0 * shape["batch"] * shape["heads_q"] * shape["head_dim"] * visible_pairs(
        shape["seqlen_q"], shape["seqlen_k"], shape["causal"])


def warm_up(run, warmup_seconds):
    """Runs run() for at least one call and warmup_seconds; returns the last call's seconds."""
    start = time.perf_counter()
    while True:
        run_start = time.perf_counter()
        run()
        single = time.perf_counter() - run_start
        if time.perf_counter() - start >= warmup_seconds:
            return single


def time_interleaved(runs, target_seconds, min_runs, max_runs=25, warmup_seconds=0.1,
                     long_run_seconds=2.0, min_runs_long=2, min_chunk_seconds=0.1):
    """Times several zero-argument functions in alternation, as anyattn_bench does (TimeInterleaved
    in bench/timing.h), so that a slow moment of a shared host falls on all of them alike: each
    warms up, then every round runs each in turn for a chunk of calls about as long as one call of
    the slowest (at least min_chunk_seconds), for clamp(ceil(target / chunk), min_runs, max_runs)
    rounds (at least 5 while a chunk lasts at most 0.5 s; min_runs_long when a call exceeds
    long_run_seconds). Returns, per function, a dict of median/min/max seconds and the run count,
    or the RuntimeError its call raised (it then drops out of the later rounds)."""
    results = [None] * len(runs)
    single = [0.0] * len(runs)
    for i, run in enumerate(runs):
        try:
            single[i] = warm_up(run, warmup_seconds)
        except RuntimeError as error:
            results[i] = error
    slowest = max((single[i] for i in range(len(runs)) if results[i] is None), default=0.0)
    chunk_seconds = max(min_chunk_seconds, slowest)
    min_rounds = max(min_runs, 5) if chunk_seconds <= 0.5 else min_runs
    rounds = max(min_rounds, min(max_runs, math.ceil(target_seconds / chunk_seconds)))
    if slowest > long_run_seconds:
        rounds = min(min_runs, min_runs_long)
    chunks = [max(1, int(chunk_seconds // max(t, 1e-9))) for t in single]
    samples = [[] for _ in runs]
    for _ in range(rounds):
        for i, run in enumerate(runs):
            for _ in range(chunks[i]):
                if results[i] is not None:
                    break
                run_start = time.perf_counter()
                try:
                    run()
                except RuntimeError as error:
                    results[i] = error
                    break
                samples[i].append(time.perf_counter() - run_start)
    for i, times in enumerate(samples):
        if results[i] is None:
            results[i] = dict(median_s=statistics.median(times), min_s=min(times),
                              max_s=max(times), runs=len(times))
    return results


def record_timings(row, results, peer):
    """Stores time_interleaved's results for anyattn and the peer in row, under "anyattn" and
    `peer` (or their errors, under "<name>_error"), with GFLOP/s (and K/V GB/s for decode rows)
    and, when both ran, row["speedup_vs_<peer>"] = peer time / anyattn time."""
    for name, result in zip(("anyattn", peer), results):
        if isinstance(result, RuntimeError):
            row[name] = None
            row[name + "_error"] = str(result)
            continue
        row[name] = result
        result["gflops"] = row["flops"] / result["median_s"] * 1e-9
        if "kv_bytes" in row:
            result["kv_gbps"] = row["kv_bytes"] / result["median_s"] * 1e-9
    if row["anyattn"] and row[peer]:
        row["speedup_vs_" + peer] = row[peer]["median_s"] / row["anyattn"]["median_s"]


def format_row(row, peer):
    """One table line for a row timed against `peer` (its max_abs_diff_vs_<peer> included)."""
    if row["kind"] == "decode":
        label = f"B{row['batch']} H{row['heads_q']}/{row['heads_k']} D{row['head_dim']} " \
                f"Sk{row['seqlen_k']}"
    else:
        label = f"B{row['batch']} H{row['heads_q']}/{row['heads_k']} D{row['head_dim']} " \
                f"S{row['seqlen_q']}"
    if row["kind"] in ("bwd", "varlen"):
        label = row["kind"] + " " + label
    mask = "causal" if row["causal"] else "none"
    cells = [f"{label:<26} {row['dtype']:<5} {mask:<6} {row['threads']:>3}"]
    for name in ("anyattn", peer):
        result = row.get(name)
        if result:
            rate = (f"{result['kv_gbps']:8.1f}GB/s" if "kv_gbps" in result
                    else f"{result['gflops']:8.1f}GF/s")
            cells.append(f"{result['median_s'] * 1e3:10.3f} {rate}")
        else:
            cells.append(f"{'error':>10} {'-':>12}")
    if "speedup_vs_" + peer in row:
        cells.append(f"{row['speedup_vs_' + peer]:7.2f} {row['max_abs_diff_vs_' + peer]:9.1e}")
    else:
        cells.append(f"{'-':>7} {'-':>9}")
    errors = [row[name + "_error"] for name in ("anyattn", peer) if name + "_error" in row]
    return " | ".join(cells) + ("  " + "; ".join(errors) if errors else "")


def print_worst_ratio(rows, peer):
    """Prints the row with the lowest peer time / anyattn time (the worst for anyattn), if any row
    has both times."""
    timed = [row for row in rows if "speedup_vs_" + peer in row]
    if not timed:
        return
    worst = min(timed, key=lambda row: row["speedup_vs_" + peer])
    verdict = "anyattn slower" if worst["speedup_vs_" + peer] < 1 else "anyattn never slower"
    print(f"\nworst ratio over {len(timed)} rows: {worst['speedup_vs_' + peer]:.2f}x {peer} at "
          f"{worst['key']} ({worst['threads']} thread(s)); {verdict}")


def peer_parser(description, json_name):
    """An argument parser with the options every comparison takes; results go to
    bench/results/<json_name> by default."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="path to libanyattn.so (default: search build-bench/ and "
                        "build/ of this repository)")
    parser.add_argument("--threads-list", help="thread counts, e.g. 1,2 (default: anyattn's "
                        "default, then 1)")
    parser.add_argument("--quick", action="store_true", help="a subset of rows, shorter timings")
    parser.add_argument("--filter", action="append", default=[],
                        help="run rows whose key contains every comma-separated term (keys as in "
                        "anyattn_bench); repeat to run the rows matching any")
    parser.add_argument("--no-decode", action="store_true", help="skip the decode shapes")
    parser.add_argument("--sweep", action="store_true",
                        help="run the never-slower sweep (tiny S, D 1-32 and 257-512, many short "
                        "varlen sequences) instead of the standard tables, and print the worst "
                        "ratio")
    parser.add_argument("--json", default=os.path.join("bench", "results", json_name),
                        help=f"results file (default bench/results/{json_name})")
    parser.add_argument("--target-seconds", type=float, default=None,
                        help="timed-run budget per case and implementation "
                        "(default 0.5; quick 0.2)")
    parser.add_argument("--min-runs", type=int, default=3, help="minimum timed runs (default 3)")
    return parser


def open_library(args):
    """(library, thread counts, timing options) from the parsed common options, or None (after
    saying why on stderr) when libanyattn.so cannot be found. Without --threads-list the counts
    are anyattn's default, then 1 (default only with --quick)."""
    library_path = find_library(args.lib)
    if library_path is None:
        print("libanyattn.so not found: build the library and pass --lib PATH", file=sys.stderr)
        return None
    lib = AnyattnLibrary(library_path)
    default_threads = lib.set_num_threads(0)
    if args.threads_list:
        thread_counts = [int(t) for t in args.threads_list.split(",")]
    else:
        thread_counts = [default_threads] + ([1] if default_threads != 1 and not args.quick
                                              else [])
    target = args.target_seconds or (0.2 if args.quick else 0.5)
    return lib, thread_counts, dict(target_seconds=target, min_runs=args.min_runs)
