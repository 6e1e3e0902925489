"""Experiment: where does an eager ``dist.all_reduce`` through the tritoncomm backend spend its host
time? Host microseconds per call (``n`` calls back to back, then one synchronize; 8 KB bf16) of: the
group's ``AllReduce`` called directly, the group's ``allreduce`` method, ``dist.all_reduce`` on the group,
the same three with the collective replaced by a Python no-op (pure dispatch), and NCCL; then rank 0's
cProfile of ``dist.all_reduce`` on the group. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/backend_dispatch.py --world 2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import torch.distributed as dist

from tritoncomm.integrations.backend import register
from tritoncomm.launch import launch


class _NoOp:
    max_bytes = 1 << 30

    def __call__(self, x, out):
        return out

    def close(self) -> None:
        pass


def _host_us(fn, n: int, device: torch.device) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / n * 1e6


def dispatch_rank(ctx, n: int) -> dict | None:
    register()
    g = dist.new_group(backend="tritoncomm")
    x = torch.randn(4096, device=ctx.device).to(torch.bfloat16)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    rows = {}
    for label in ("kernel", "no-op"):
        if label == "no-op":
            g.ar = _NoOp()
        for name, fn in {"direct": lambda: g.ar(x, x), "method": lambda: g.allreduce([x], opts),
                         "dist.all_reduce": lambda: dist.all_reduce(x, group=g)}.items():
            ctx.barrier()
            rows[f"{label} {name}"] = _host_us(fn, n, ctx.device)
    ctx.barrier()
    rows["nccl dist.all_reduce"] = _host_us(lambda: dist.all_reduce(x, group=ctx.group), n, ctx.device)
    prof = None
    if ctx.rank == 0:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            dist.all_reduce(x, group=g)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(20)
        prof = s.getvalue()
    dist.destroy_process_group(g)
    return {"rank": ctx.rank, "host_us_per_call": rows, "profile_rank0": prof}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    reps = launch(dispatch_rank, a.world, a.calls, backend="cuda", timeout=600)
    for r in reps:
        print(f"rank {r['rank']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["host_us_per_call"].items()))
    print(reps[0]["profile_rank0"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reps, f, indent=1)


if __name__ == "__main__":
    main()
