#!/usr/bin/env python3
"""Serving batches that mix prefill chunks and decode steps, in one paged varlen call.

A serving engine with chunked prefill (vLLM, sglang) sends one flash_attn_varlen_func call with
block_table per step: a few sequences prefill a chunk of their prompt, the rest decode one token.
This script times, for each mix, in alternation (peer_timing.time_interleaved, the rules of
anyattn_bench's tables):

  mixed   the whole batch in one anyattn call, as the engine sends it;
  split   the same sequences in two anyattn calls, those with several queries in one and the
          decode steps in the other: the cost of each kind on its own;
  sdpa    the fallback a user writes without a paged kernel (when torch has no
          scaled_dot_product_attention it is skipped): per sequence, gather the pages of K and V
          with index_select and call torch's scaled_dot_product_attention with the bottom-right
          causal mask, GQA through enable_gqa.

and prints the median times, the K/V bytes the mixed call reads per second (each sequence's keys
and values once), the ratios split / mixed and sdpa / mixed, and max |mixed - sdpa|. Every mix is
Hq = 32, Hk = 8, D = 128, causal, pages of 16 tokens, the pages of all sequences shuffled through
one block table.

    .venv/bin/python bench/mixed_batch.py [--quick] [--threads-list 2,1] [--dtypes bf16,f32]

It runs the installed anyattn package (scripts/setup.sh --python builds it from this tree) and
needs torch; without torch it says so and exits 0. JSON goes to bench/results/mixed_batch.json.
"""

import argparse
import json
import os
import sys

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from peer_timing import time_interleaved  # noqa: E402

HEADS_Q, HEADS_K, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16

# (name, [(queries, keys)] per sequence). Queries are the last of the sequence's keys.
MIXES = [
    ("1 chunk 512 + 31 decode @4096", [(512, 512)] + [(1, 4096)] * 31),
    ("4 chunks 256 @2048 + 60 decode @2048", [(256, 2048)] * 4 + [(1, 2048)] * 60),
    ("16 spec-4 @4096 + 16 decode @4096", [(4, 4096)] * 16 + [(1, 4096)] * 16),
]


def parse_mix(spec):
    """(spec, [(queries, keys)] per sequence) from "COUNTxQUERIES@KEYS,..."."""
    seqs = []
    for term in spec.split(","):
        try:
            count, rest = term.split("x")
            queries, keys = (int(n) for n in rest.split("@"))
            count = int(count)
        except ValueError:
            raise SystemExit(f"--mix term {term!r}: expected COUNTxQUERIES@KEYS, e.g. 31x1@4096")
        if count < 1 or not 1 <= queries <= keys:
            raise SystemExit(f"--mix term {term!r}: need COUNT >= 1 and 1 <= QUERIES <= KEYS")
        seqs += [(queries, keys)] * count
    return spec, seqs


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads-list", default="2,1", help="thread counts (default 2,1)")
    parser.add_argument("--dtypes", default="bf16,f32", help="K/V and q dtypes (default bf16,f32)")
    parser.add_argument("--quick", action="store_true",
                        help="the first mix only, shorter timings")
    parser.add_argument("--mix", action="append", default=[],
                        help="a mix of your own instead of the built-in ones, as comma-separated "
                        "COUNTxQUERIES@KEYS terms, e.g. 1x512@512,31x1@4096; repeat for more")
    parser.add_argument("--no-sdpa", action="store_true", help="skip the torch SDPA peer")
    parser.add_argument("--json", default=os.path.join("bench", "results", "mixed_batch.json"),
                        help="results file (default bench/results/mixed_batch.json)")
    parser.add_argument("--target-seconds", type=float, default=None,
                        help="timed-run budget per call kind (default 0.5; quick 0.2)")
    parser.add_argument("--min-runs", type=int, default=3, help="minimum timed runs (default 3)")
    return parser.parse_args()


class PagedBatch:
    """q (total_q, Hq, D), a paged K/V cache (num_blocks, PAGE_SIZE, Hk, D) and the varlen metadata
    of a list of (queries, keys) sequences, sequence b's pages being block_table[b]."""

    def __init__(self, torch, seqs, q, k_cache, v_cache, block_table):
        self.torch = torch
        self.seqs = seqs
        self.q, self.k_cache, self.v_cache, self.block_table = q, k_cache, v_cache, block_table
        lens_q = [sq for sq, _ in seqs]
        lens_k = [sk for _, sk in seqs]
        self.cu_seqlens_q = torch.tensor([0] + lens_q).cumsum(0, dtype=torch.int32)
        self.cu_seqlens_k = torch.tensor([0] + lens_k).cumsum(0, dtype=torch.int32)
        self.seqused_k = torch.tensor(lens_k, dtype=torch.int32)
        self.max_q, self.max_k = max(lens_q), max(lens_k)
        self.kv_bytes = 2 * sum(lens_k) * HEADS_K * HEAD_DIM * k_cache.element_size()

    @staticmethod
    def random(torch, seqs, dtype, generator):
        """Values uniform in [-1, 1); every sequence's pages scattered through one shuffled
        table."""
        pages = [-(-sk // PAGE_SIZE) for _, sk in seqs]
        order = torch.randperm(sum(pages), generator=generator).to(torch.int32)
        block_table = torch.zeros(len(seqs), max(pages), dtype=torch.int32)
        first = 0
        for b, count in enumerate(pages):
            block_table[b, :count] = order[first:first + count]
            first += count

        def uniform(*shape):
            return torch.rand(shape, generator=generator).mul_(2).sub_(1).to(dtype)

        cache_shape = (sum(pages), PAGE_SIZE, HEADS_K, HEAD_DIM)
        q = uniform(sum(sq for sq, _ in seqs), HEADS_Q, HEAD_DIM)
        return PagedBatch(torch, seqs, q, uniform(*cache_shape), uniform(*cache_shape),
                          block_table)

    def subset(self, indices):
        """The sequences `indices` as a batch of their own, over the same cache (q rows copied)."""
        rows = [self.torch.arange(int(self.cu_seqlens_q[i]), int(self.cu_seqlens_q[i + 1]))
                for i in indices]
        return PagedBatch(self.torch, [self.seqs[i] for i in indices],
                          self.q[self.torch.cat(rows)], self.k_cache, self.v_cache,
                          self.block_table[indices].contiguous())

    def anyattn_call(self, anyattn):
        """flash_attn_varlen_func over the paged cache, as a serving engine calls it."""
        return anyattn.flash_attn_varlen_func(
            self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.cu_seqlens_k, self.max_q,
            self.max_k, causal=True, block_table=self.block_table, seqused_k=self.seqused_k)

    def sdpa_call(self):
        """Per sequence: gather its pages, then scaled_dot_product_attention with the bottom-right
        causal mask (query i sees keys j <= i + Sk - Sq); returns (total_q, Hq, D)."""
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        outs = []
        for b, (sq, sk) in enumerate(self.seqs):
            pages = self.block_table[b, :-(-sk // PAGE_SIZE)]
            k = self.k_cache.index_select(0, pages).flatten(0, 1)[:sk].transpose(0, 1)
            v = self.v_cache.index_select(0, pages).flatten(0, 1)[:sk].transpose(0, 1)
            start = int(self.cu_seqlens_q[b])
            q = self.q[start:start + sq].transpose(0, 1)
            mask = None
            if sq > 1:
                mask = (torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq))
            outs.append(sdpa(q, k, v, attn_mask=mask, enable_gqa=True).transpose(0, 1))
        return torch.cat(outs)


def run_mix(torch, anyattn, name, seqs, dtype_name, threads, timing, with_sdpa):
    """Times one mix (mixed call, split calls, and the SDPA loop when with_sdpa) in alternation;
    returns its JSON row: each kind's timing (or its error), GB/s, the ratios and max |diff|."""
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype_name]
    batch = PagedBatch.random(torch, seqs, dtype, torch.Generator().manual_seed(7))
    parts = [batch.subset(indices) for indices in
             ([i for i, (q, _) in enumerate(seqs) if q > 1],
              [i for i, (q, _) in enumerate(seqs) if q == 1]) if indices]
    calls = [lambda: batch.anyattn_call(anyattn),
             lambda: [part.anyattn_call(anyattn) for part in parts]]
    if with_sdpa:
        calls.append(batch.sdpa_call)
    results = time_interleaved(calls, **timing)
    row = dict(mix=name, dtype=dtype_name, threads=threads, sequences=len(seqs),
               kv_bytes=batch.kv_bytes)
    for label, result in zip(("mixed", "split", "sdpa"), results):
        row[label] = None if isinstance(result, RuntimeError) else result
        if isinstance(result, RuntimeError):
            row[label + "_error"] = str(result)
    if row["mixed"]:
        row["mixed"]["kv_gbps"] = batch.kv_bytes / row["mixed"]["median_s"] * 1e-9
        for peer in ("split", "sdpa"):
            if row.get(peer):
                row[peer + "_over_mixed"] = row[peer]["median_s"] / row["mixed"]["median_s"]
    if with_sdpa and row["mixed"] and row["sdpa"]:
        got = batch.anyattn_call(anyattn).float()
        row["max_abs_diff_vs_sdpa"] = float((got - batch.sdpa_call().float()).abs().max())
    return row


def format_row(row):
    """One table line of a run_mix row ('-' for what did not run, 'error' for what failed)."""
    def cell(label):
        if label not in row:
            return f"{'-':>9}"
        result = row[label]
        return f"{result['median_s'] * 1e3:9.2f}" if result else f"{'error':>9}"

    def ratio(key):
        return f"{row[key]:7.2f}" if key in row else f"{'-':>7}"

    diff = (f"{row['max_abs_diff_vs_sdpa']:9.1e}" if "max_abs_diff_vs_sdpa" in row
            else f"{'-':>9}")
    gbps = f"{row['mixed']['kv_gbps']:7.1f}" if row["mixed"] else f"{'-':>7}"
    errors = [row[k] for k in ("mixed_error", "split_error", "sdpa_error") if k in row]
    return (f"{row['mix']:<38} {row['dtype']:<5} {row['threads']:>3} | {cell('mixed')} {gbps} | "
            f"{cell('split')} {ratio('split_over_mixed')} | {cell('sdpa')} "
            f"{ratio('sdpa_over_mixed')} {diff}" + ("  " + "; ".join(errors) if errors else ""))


def main():
    args = parse_args()
    try:
        import torch
    except ImportError:
        print("mixed_batch: torch is not importable; nothing to run")
        return 0
    import anyattn
    with_sdpa = not args.no_sdpa and hasattr(torch.nn.functional, "scaled_dot_product_attention")
    timing = dict(target_seconds=args.target_seconds or (0.2 if args.quick else 0.5),
                  min_runs=args.min_runs)
    mixes = [parse_mix(spec) for spec in args.mix] or (MIXES[:1] if args.quick else MIXES)
    print(f"Hq{HEADS_Q}/Hk{HEADS_K} D{HEAD_DIM}, causal, pages of {PAGE_SIZE}; median ms of "
          "each; GB/s = K/V bytes read by the mixed call per second; x = time / mixed time")
    print(f"{'mix':<38} {'dtype':<5} {'thr':>3} | {'mixed ms':>9} {'GB/s':>7} | "
          f"{'split ms':>9} {'x':>7} | {'sdpa ms':>9} {'x':>7} {'max|diff|':>9}")
    rows = []
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads_list.split(",")):
            anyattn.set_num_threads(threads)
            torch.set_num_threads(threads)
            for dtype_name in args.dtypes.split(","):
                for name, seqs in mixes:
                    row = run_mix(torch, anyattn, name, seqs, dtype_name, threads, timing,
                                  with_sdpa)
                    print(format_row(row), flush=True)
                    rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(rows=rows), f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
