"""Runs one function in N processes that form a torch.distributed gloo group on loopback.

Shared by python/tests/test_ring_flash_attn.py and bench/ring_attention.py, which run the
ring-flash-attn package (PyPI) over anyattn's flash-attn layer on CPU.

    results = run_ranks(3, "ring_cases:run_rank", args=(...,), timeout_s=90)

starts 3 processes with torch.multiprocessing's spawn context; in each, ``run_rank(rank,
world_size, *args)`` runs after the process group is up and its return value (picklable: plain
Python and numpy, not torch tensors) comes back in rank order. Contract:

- The group is gloo over loopback only: each worker sets GLOO_SOCKET_IFNAME=lo, so gloo's
  sockets bind to 127.0.0.1, and the ranks meet through a torch FileStore in a temporary
  directory, so no rendezvous port is opened (nor raced for) at all.
- Before the entry module is imported, each worker puts ``ring_deps_dir()`` (the pinned
  ring-flash-attn and transformers 4.x that scripts/setup.sh installs) first on sys.path, and sets
  torch's and anyattn's thread counts to ``threads_per_rank``.
- A worker that raises, or dies without a result, fails the whole run: the others are ended and
  RankFailure carries every traceback received. Past ``timeout_s`` all workers are ended and
  RankFailure says which ranks had not answered. No worker outlives run_ranks.
"""

from __future__ import annotations

import datetime
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, List, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Seconds a worker gets to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0


class RankFailure(RuntimeError):
    """One or more workers raised, died or timed out; the message holds their tracebacks."""


def ring_deps_dir() -> str:
    """Where scripts/setup.sh installs ring-flash-attn and its transformers 4.x (--target)."""
    return os.environ.get("ANYATTN_RING_DEPS", os.path.join(REPO, "build", "ring-deps"))


def ring_deps_installed() -> bool:
    """True when ring_deps_dir() holds the ring_flash_attn and transformers packages."""
    deps = ring_deps_dir()
    return all(os.path.isdir(os.path.join(deps, name)) for name in ("ring_flash_attn", "transformers"))


def _worker(rank: int, world_size: int, store_path: str, entry: str, args: Sequence[Any],
            threads_per_rank: int, timeout_s: float, deps_dir: str, conn) -> None:
    """Process body: path and threads, the process group, the entry, the result or traceback."""
    try:
        if "transformers" in sys.modules:
            raise RuntimeError("transformers was imported before the ring dependencies were put "
                               "on sys.path; the entry module must not import it at load time")
        sys.path.insert(0, deps_dir)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        import torch
        import torch.distributed as dist

        import anyattn

        torch.set_num_threads(threads_per_rank)
        anyattn.set_num_threads(threads_per_rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        try:
            module_name, function_name = entry.split(":")
            function = getattr(importlib.import_module(module_name), function_name)
            result = function(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        conn.send(("ok", result))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _end(processes) -> None:
    """SIGTERM every live worker, then SIGKILL those still alive after the grace period."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def run_ranks(world_size: int, entry: str, args: Sequence[Any] = (), *, timeout_s: float,
              threads_per_rank: int = 1) -> List[Any]:
    """``module:function`` run as ranks 0..world_size-1; returns their results in rank order.

    Raises RankFailure on any worker error, death or timeout (see the module docstring).
    """
    import torch.multiprocessing as mp
    from multiprocessing.connection import wait

    context = mp.get_context("spawn")
    store_dir = tempfile.mkdtemp(prefix="anyattn-ring-")
    store_path = os.path.join(store_dir, "store")
    processes, connections = [], []
    for rank in range(world_size):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_worker, name=f"ring-rank-{rank}", daemon=True,
            args=(rank, world_size, store_path, entry, tuple(args), threads_per_rank, timeout_s,
                  ring_deps_dir(), sender))
        process.start()
        sender.close()
        processes.append(process)
        connections.append(receiver)

    results: List[Any] = [None] * world_size
    pending = set(range(world_size))
    errors: List[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while pending and not errors:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append(f"timed out after {timeout_s:.0f} s waiting for ranks {sorted(pending)}")
                break
            wait([connections[rank] for rank in pending] + [processes[rank].sentinel for rank in pending],
                 timeout=remaining)
            for rank in sorted(pending):
                if connections[rank].poll():
                    try:
                        status, payload = connections[rank].recv()
                    except EOFError:
                        status, payload = "error", "exited without sending a result"
                    pending.discard(rank)
                    if status == "ok":
                        results[rank] = payload
                    else:
                        errors.append(f"rank {rank}:\n{payload}")
                elif not processes[rank].is_alive():
                    pending.discard(rank)
                    errors.append(f"rank {rank}: exited with code {processes[rank].exitcode} "
                                  "without a result")
        if errors:
            # Give the peers of a failed rank a moment to report their side before ending them.
            grace = time.monotonic() + 2.0
            for rank in sorted(pending):
                if connections[rank].poll(max(0.0, grace - time.monotonic())):
                    try:
                        status, payload = connections[rank].recv()
                    except EOFError:
                        continue
                    if status == "error":
                        errors.append(f"rank {rank}:\n{payload}")
    finally:
        if not errors:
            # Every rank has sent its result and is on its way out; let it exit by itself.
            exit_deadline = time.monotonic() + TERMINATE_GRACE_S
            for process in processes:
                process.join(max(0.0, exit_deadline - time.monotonic()))
        _end(processes)
        for connection in connections:
            connection.close()
        shutil.rmtree(store_dir, ignore_errors=True)
    if errors:
        raise RankFailure(f"{world_size}-rank run of {entry} failed:\n" + "\n".join(errors))
    return results
