"""Host-time helpers shared by the launch-path experiments (``launch_overhead.py``, ``funcol_host.py``,
``backend_dispatch.py``). Not part of the library."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections.abc import Callable
from typing import Any

import torch

from tritoncomm.launch import launch


def host_us(fn: Callable[[], Any], n: int, device: torch.device, barrier: Callable[[], None] | None = None,
            warmup: int = 0) -> float:
    """Host time per call: the best of 5 loops of ``n`` calls (after ``warmup`` calls), each loop
    after a device sync and ``barrier`` (the ranks', where given), timed before the stream is drained
    (``n`` stays below the launch queue's depth, so the GPU never holds the host back; in the CPU
    world there is nothing to drain)."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(5):
        if cuda:
            torch.cuda.synchronize(device)
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
    return best / n * 1e6


def profile_text(fn: Callable[[], Any], n: int, lines: int) -> str:
    """cProfile of ``n`` calls of ``fn``, the ``lines`` entries with the most own time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(lines)
    return s.getvalue()


def main_for(rank_fn: Callable[..., dict], calls: int) -> None:
    """The experiments' command line: ``--world``, ``--calls``, ``--json``; runs ``rank_fn(ctx,
    calls)`` on local GPU ranks and prints every rank's host times, then rank 0's profile."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=calls)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    reps = launch(rank_fn, a.world, a.calls, backend="cuda", timeout=600)
    for r in reps:
        print(f"rank {r['rank']} (world {a.world}): " + ", ".join(f"{k} {v}" for k, v in r.items()
                                                                   if k not in ("rank", "host_us_per_call",
                                                                                "profile_rank0")))
        for k, v in r["host_us_per_call"].items():
            print(f"  {k:45s} {v:8.2f} us")
    print(reps[0]["profile_rank0"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reps, f, indent=1)
