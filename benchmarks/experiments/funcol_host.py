"""Experiment: host time per call of the paths by which torch code reaches a ``tritoncomm`` group:
``dist.all_reduce``, the functional-collective ops (``_c10d_functional.all_reduce_`` then
``wait_tensor``, what DTensor's redistribute runs) and ``funcol.all_reduce(...).wait()``, beside the
group's ``AllReduce`` called directly, and the same torch paths on the default group (NCCL on GPUs,
gloo in the CPU world). ``--no-launch`` replaces every tritoncomm all-reduce launch with a Python
no-op, so that only our host paths remain (the CPU world's interpreted kernels would swamp them); the
default group's calls run as they are. 8 KB bf16, the best of 5 loops of 200 calls, each loop after a
device sync and a barrier of the ranks (so that neither rank's launch queue fills while it waits for
the other), each rank. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/funcol_host.py --world 2 --no-launch
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from hosttime import host_us  # benchmarks/experiments/, the script's directory

from tritoncomm.integrations.backend import register
from tritoncomm.launch import launch


def _rank(ctx, no_launch: bool) -> dict[str, float]:
    register()
    g = dist.new_group(backend="tritoncomm")
    x = torch.randn(4096, device=ctx.device).to(torch.bfloat16)
    g.ar(x, x)  # compiled and run once with the real kernel
    if no_launch:
        for a in map(g.ar.algorithm, g.ar.algorithms):
            a.launcher = lambda *args, **kw: None
    op = torch.ops._c10d_functional
    paths = {"direct AllReduce": lambda: g.ar(x, x)}
    for who, grp in (("", g), ("default group: ", ctx.group)):
        name = grp.group_name
        paths |= {f"{who}dist.all_reduce": lambda grp=grp: dist.all_reduce(x, group=grp),
                  f"{who}dist.all_reduce(async_op=True).wait()":
                      lambda grp=grp: dist.all_reduce(x, group=grp, async_op=True).wait(),
                  f"{who}all_reduce_ op + wait_tensor":
                      lambda name=name: op.wait_tensor(op.all_reduce_(x, "sum", name)),
                  f"{who}funcol.all_reduce(...).wait()": lambda grp=grp: funcol.all_reduce(x, "sum", grp).wait()}
    out = {k: round(host_us(fn, 200, ctx.device, ctx.barrier, warmup=50), 2) for k, fn in paths.items()}
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
