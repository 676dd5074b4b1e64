#!/usr/bin/env python3
"""How much an anyattn call slows down right after a parallel torch op.

torch's OpenMP workers keep spinning on their cores for a while after each parallel op (unless
OMP_WAIT_POLICY=PASSIVE was set before Python started). The package therefore runs anyattn's
parallel phases on torch's OpenMP team (python/src/host_openmp.cc); on anyattn's own pool
(ANYATTN_HOST_OPENMP=0) a call made in that window competes with the spinning workers for the
cores. This script times one anyattn call alone and right after a torch matmul, alternately, and
prints the medians:

    .venv/bin/python bench/torch_omp_spin.py                          # on torch's team
    ANYATTN_HOST_OPENMP=0 .venv/bin/python bench/torch_omp_spin.py    # on the pool
    ANYATTN_HOST_OPENMP=0 OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/torch_omp_spin.py

The call is a decode step through the installed anyattn package: flash_attn_with_kvcache, bf16,
B=1, Hq=32, Hk=8, D=128, a cache of 4096 keys; the torch op is a 64x2048 by 2048x2048 f32 matmul.
Both use the same thread count (--threads, default 2).
"""

import argparse
import os
import statistics
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch and anyattn threads")
    parser.add_argument("--runs", type=int, default=60, help="timed calls per median")
    parser.add_argument("--rounds", type=int, default=3, help="medians printed per mode")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("torch is not installed; nothing to measure")
        return
    import anyattn

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    anyattn.set_num_threads(args.threads)
    q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
    k_cache = torch.randn(1, 4096, 8, 128, dtype=torch.bfloat16)
    v_cache = torch.randn(1, 4096, 8, 128, dtype=torch.bfloat16)
    x = torch.randn(64, 2048)
    w = torch.randn(2048, 2048)

    def median_ms(after_matmul):
        times = []
        for _ in range(args.runs):
            if after_matmul:
                torch.matmul(x, w)
            start = time.perf_counter()
            anyattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4096)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    from anyattn import _core
    runtime = _core.host_openmp()
    print(f"parallel phases on {'the pool' if runtime is None else runtime}")
    print(f"OMP_WAIT_POLICY={policy}, {args.threads} threads, anyattn {anyattn.__version__}, "
          f"torch {torch.__version__}")
    median_ms(False)
    for _ in range(args.rounds):
        alone = median_ms(False)
        after = median_ms(True)
        print(f"decode alone {alone:.3f} ms   right after a torch matmul {after:.3f} ms   "
              f"ratio {after / alone:.2f}")


if __name__ == "__main__":
    main()
