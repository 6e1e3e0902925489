"""Experiment: host time per call of the paths by which torch code reaches a ``tritoncomm`` group:
``dist.all_reduce``, the functional-collective ops (``_c10d_functional.all_reduce_`` then
``wait_tensor``, what DTensor's redistribute runs) and ``funcol.all_reduce(...).wait()``, beside the
group's ``AllReduce`` called directly. ``--no-launch`` replaces every all-reduce launch with a
Python no-op, so that only the host paths remain (the CPU world's interpreted kernels would swamp
them). 8 KB bf16, the best of 5 loops of 1000 calls, each rank. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/funcol_host.py --world 2 --no-launch
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tritoncomm.integrations.backend import register
from tritoncomm.launch import launch


def _best_us(fn: Callable[[], object], device: torch.device, n: int = 1000) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return round(best / n * 1e6, 2)


def _rank(ctx, no_launch: bool) -> dict[str, float]:
    register()
    g = dist.new_group(backend="tritoncomm")
    x = torch.randn(4096, device=ctx.device).to(torch.bfloat16)
    g.ar(x, x)  # compiled and run once with the real kernel
    if no_launch:
        for a in g.ar._algos.values():
            a.launcher = lambda *args, **kw: None
    op, name = torch.ops._c10d_functional, g.group_name
    paths = {"direct AllReduce": lambda: g.ar(x, x),
             "dist.all_reduce": lambda: dist.all_reduce(x, group=g),
             "dist.all_reduce(async_op=True).wait()": lambda: dist.all_reduce(x, group=g, async_op=True).wait(),
             "all_reduce_ op + wait_tensor": lambda: op.wait_tensor(op.all_reduce_(x, "sum", name)),
             "funcol.all_reduce(...).wait()": lambda: funcol.all_reduce(x, "sum", g).wait()}
    out = {k: _best_us(fn, ctx.device) for k, fn in paths.items()}
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    dist.barrier(group=ctx.cpu_group)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--no-launch", action="store_true")
    a = ap.parse_args()
    for rank, rep in enumerate(launch(_rank, a.world, a.no_launch)):
        print(f"rank {rank}: " + ", ".join(f"{k} {v} us" for k, v in rep.items()))


if __name__ == "__main__":
    main()
