#!/usr/bin/env python3
"""Ring attention on CPU: ring-flash-attn 0.1.8 over anyattn against one anyattn process.

At one total sequence length, runs forward + backward of

  1 process   anyattn.flash_attn_func over the whole sequence, on every core;
  N ranks     ring_flash_attn_func and zigzag_ring_flash_attn_func (ring-flash-attn, through
              anyattn.install_as_flash_attn()), each rank holding 1/N of the sequence, for each N
              of --world-sizes; gloo over loopback (bench/ring_launch.py),

and prints one row per rank: its threads, the median time of a call, that time over the one
process's, the peak memory of a call, that peak over the one process's, and the bytes of the
rank's inputs (q, k, v and the output gradient), which the peak does not include. The cores are
shared, not oversubscribed where it can be helped: N ranks get max(1, cores // N) threads each
(torch's and anyattn's), the one process gets all cores.

What is timed: in each worker, one warm-up call per function (thread pools, TorchScript, gloo
buffers), then --repeats calls, each after a barrier across the ranks; a rank's time is its own
forward + backward, the ring's communication and waits included. The "slowest" line of a run is
the median over repetitions of the slowest rank, the time a training step would wait for.

What "peak memory" is: the peak resident set size of the worker process during its first timed
call, minus its resident size just before that call (inputs, torch, the process group already in
place). The kernel's high-water mark (VmHWM) is reset right before the call by writing 5 to
/proc/self/clear_refs, so the figure belongs to that call alone; the workers run with
MALLOC_MMAP_THRESHOLD_=65536, so that glibc returns freed tensors to the kernel instead of keeping
the warm-up's memory for reuse, where the call would not show it. Where clear_refs is not
writable, the ru_maxrss increase across the call is reported instead (marked "*"), which reads
low if the process peaked higher earlier. Python's tracemalloc does not see torch's allocations,
and torch keeps no CPU allocator statistics, hence the RSS.

    .venv/bin/python bench/ring_attention.py [--seqlen 3072] [--world-sizes 2,3] [--repeats 3]

Needs torch, the anyattn package (scripts/setup.sh --python builds it into .venv) and
ring-flash-attn in build/ring-deps (the same script's install_ring_flash_attn_deps step).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from ring_launch import ring_deps_dir, ring_deps_installed, run_ranks  # noqa: E402

DTYPES = {"bf16": "bfloat16", "f16": "float16"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=3072,
                        help="total sequence length, a multiple of 2 * each world size (default 3072)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads-q", type=int, default=8)
    parser.add_argument("--heads-k", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="bf16 (default) or f16; ring-flash-attn's f32 backward is wrong "
                        "(docs/distributed.md)")
    parser.add_argument("--no-causal", action="store_true",
                        help="full attention (zigzag, which is causal only, is then skipped)")
    parser.add_argument("--world-sizes", default="2,3", help="rank counts (default 2,3)")
    parser.add_argument("--functions", default="ring,zigzag", help="ring, zigzag or both")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per run (default 3)")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                        help="cores to share among the ranks (default: this process's affinity)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    return parser.parse_args()


def _memory_kib():
    """(VmRSS, VmHWM) of this process in KiB, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":")
                fields[name] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak() -> bool:
    """Sets VmHWM to the current RSS; False where /proc/self/clear_refs is not writable."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _attention(function: str):
    """The callable (q, k, v, causal=...) of "single", "ring" or "zigzag"."""
    import anyattn

    if function == "single":
        return anyattn.flash_attn_func
    anyattn.install_as_flash_attn()
    import ring_flash_attn

    return {"ring": ring_flash_attn.ring_flash_attn_func,
            "zigzag": ring_flash_attn.zigzag_ring_flash_attn_func}[function]


def measure_rank(rank: int, world_size: int, functions, config: dict) -> dict:
    """Worker body: for each of ``functions`` ("single" is anyattn.flash_attn_func on world_size
    1; "ring", "zigzag"), a warm-up call, then ``repeats`` timed calls, the first of them also
    measured for peak memory. Returns {function: {"threads", "times" (seconds), "peak_bytes",
    "peak_from_hwm", "input_bytes" (q, k, v and dout, held before the call)}}."""
    import torch
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(rank)
    dtype = getattr(torch, config["dtype"])
    local = config["seqlen"] // world_size
    shapes = [(config["batch"], local, heads, config["head_dim"])
              for heads in (config["heads_q"], config["heads_k"], config["heads_k"])]
    q, k, v = (torch.randn(shape, generator=generator).to(dtype).requires_grad_(True)
               for shape in shapes)
    dout = torch.randn(shapes[0], generator=generator).to(dtype)
    results = {}
    for function in functions:
        attention = _attention(function)

        def call():
            for x in (q, k, v):
                x.grad = None
            attention(q, k, v, causal=config["causal"]).backward(dout)

        dist.barrier()
        call()
        times = []
        for repeat in range(config["repeats"]):
            dist.barrier()
            if repeat == 0:
                from_hwm = _reset_peak()
                rss_before = _memory_kib()[0]
                maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
            if repeat == 0:
                if from_hwm:
                    peak_kib = _memory_kib()[1] - rss_before
                else:
                    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before
        results[function] = {"threads": torch.get_num_threads(), "times": times,
                             "peak_bytes": peak_kib * 1024, "peak_from_hwm": from_hwm,
                             "input_bytes": sum(x.nbytes for x in (q, k, v, dout))}
    return results


def _run(functions, world_size: int, config: dict, args) -> list:
    """Per-rank results of measure_rank in world_size fresh worker processes."""
    threads = max(1, args.cores // world_size)
    return run_ranks(world_size, "ring_attention:measure_rank", args=(functions, config),
                     timeout_s=args.timeout, threads_per_rank=threads)


def _slowest_median(ranks: list) -> float:
    """Median over repetitions of the slowest rank's time."""
    return statistics.median(max(rank["times"][i] for rank in ranks)
                             for i in range(len(ranks[0]["times"])))


def main() -> int:
    args = parse_args()
    if not ring_deps_installed():
        print(f"ring-flash-attn is not installed in {ring_deps_dir()}: run scripts/setup.sh "
              "--python (its install_ring_flash_attn_deps step)")
        return 1
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    world_sizes = [int(n) for n in args.world_sizes.split(",")]
    functions = [name for name in args.functions.split(",") if name]
    if args.no_causal and "zigzag" in functions:
        print("zigzag_ring_flash_attn_func is causal only: skipped with --no-causal")
        functions.remove("zigzag")
    for n in world_sizes:
        if args.seqlen % (2 * n):
            raise SystemExit(f"--seqlen {args.seqlen} is not a multiple of 2 * {n} (zigzag halves)")
    config = {"seqlen": args.seqlen, "batch": args.batch, "heads_q": args.heads_q,
              "heads_k": args.heads_k, "head_dim": args.head_dim, "dtype": DTYPES[args.dtype],
              "causal": not args.no_causal, "repeats": args.repeats}
    print(f"forward + backward, B={args.batch} S={args.seqlen} Hq={args.heads_q} "
          f"Hk={args.heads_k} D={args.head_dim} {args.dtype} "
          f"{'full' if args.no_causal else 'causal'}, {args.cores} cores, "
          f"median of {args.repeats} calls; peak = the first timed call's RSS high-water mark over "
          f"the RSS before it")
    # Fixed, so that glibc does not raise it after the warm-up and keep freed tensors (see above).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    started = time.monotonic()
    single = _run(["single"], 1, config, args)[0]["single"]
    single_time = statistics.median(single["times"])
    header = (f"{'run':<12}{'rank':>8}{'threads':>8}{'seq/rank':>9}{'median ms':>11}"
              f"{'x 1 proc':>9}{'peak MiB':>10}{'x 1 proc':>9}{'inputs MiB':>11}")
    print(header)
    print("-" * len(header))

    def row(name, rank, result, seq):
        median = statistics.median(result["times"])
        mark = "" if result["peak_from_hwm"] else "*"
        print(f"{name:<12}{rank:>8}{result['threads']:>8}{seq:>9}{median * 1e3:>11.1f}"
              f"{median / single_time:>9.2f}{result['peak_bytes'] / 2**20:>9.1f}{mark:1}"
              f"{result['peak_bytes'] / max(single['peak_bytes'], 1):>9.2f}"
              f"{result['input_bytes'] / 2**20:>11.1f}")

    row("1 process", 0, single, args.seqlen)
    for world_size in world_sizes:
        ranks = _run(functions, world_size, config, args)
        for function in functions:
            name = f"{function} x{world_size}"
            for rank, results in enumerate(ranks):
                row(name, rank, results[function], args.seqlen // world_size)
            slowest = _slowest_median([results[function] for results in ranks])
            print(f"{name:<12}{'slowest':>8}{'':>17}{slowest * 1e3:>11.1f}"
                  f"{slowest / single_time:>9.2f}")
    print(f"({time.monotonic() - started:.0f} s in all; * = ru_maxrss increase, "
          "/proc/self/clear_refs not writable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
