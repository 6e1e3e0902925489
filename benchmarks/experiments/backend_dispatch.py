"""Experiment: where does an eager ``dist.all_reduce`` through the tritoncomm backend spend its host
time? Host microseconds per call (``n`` calls back to back, then one synchronize; 8 KB bf16) of: the
group's ``AllReduce`` called directly, the group's ``allreduce`` method, ``dist.all_reduce`` on the group,
the same three with the collective replaced by a Python no-op (pure dispatch), each method and
``dist.all_reduce`` also with a new work object per call (instead of the group's one completed work),
three interleaved rounds, best of each; NCCL; the pieces of the method on their own (the checks,
reading the reduce op, creating a work object); then rank 0's cProfile of ``dist.all_reduce`` on the
group. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/backend_dispatch.py --world 2

At ``--world 1`` (one GPU) the group, which delegates everything at one rank, is given a one-rank
``AllReduce`` to serve with, so the backend's host path can be timed on a single GPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from hosttime import host_us, main_for, profile_text  # benchmarks/experiments/, the script's directory

import tritoncomm as tc
from tritoncomm.integrations import backend as be


class _NoOp:
    max_bytes = 1 << 30

    def __call__(self, x, out):
        return out

    def close(self) -> None:
        pass


def dispatch_rank(ctx, n: int) -> dict | None:
    be.register()
    g = dist.new_group(backend="tritoncomm")
    comm = None
    if g.ar is None:
        if ctx.world != 1:
            raise RuntimeError("the tritoncomm group serves nothing here (probe failed)")
        comm = tc.Communicator(ctx.cpu_group)  # one rank: serve with a one-rank AllReduce
        g.ar, g.device = tc.AllReduce(comm, max_bytes=1 << 20), ctx.device
    x = torch.randn(4096, device=ctx.device).to(torch.bfloat16)
    opts = dist.AllreduceOptions()
    opts.reduceOp, opts.asyncOp = dist.ReduceOp.SUM, False
    real, noop, own = g.ar, _NoOp(), g._work
    fresh = lambda outputs, o: be.TritonCommWork(outputs)  # noqa: E731  (a work object per call)
    # name -> (the collective the group serves with, how it makes work objects, the call)
    variants = {}
    for label, ar in (("kernel", real), ("no-op", noop)):
        variants[f"{label} direct"] = (ar, own, lambda ar=ar: ar(x, x))
        for tag, work in (("", own), (", work per call", fresh)):
            variants[f"{label} method{tag}"] = (ar, work, lambda: g.allreduce([x], opts))
            variants[f"{label} dist.all_reduce{tag}"] = (ar, work, lambda: dist.all_reduce(x, group=g))
    rows: dict[str, float] = {}
    for _ in range(3):  # interleaved rounds: the host's speed drifts; keep each variant's best
        for name, (ar, work, fn) in variants.items():
            g.ar, g._work = ar, work
            ctx.barrier()
            rows[name] = min(rows.get(name, float("inf")), host_us(fn, n, ctx.device))
    g.ar, g._work = noop, own
    parts = {"served checks (_ar_ok)": lambda: g._ar_ok(x), "reduce op read": lambda: opts.reduceOp,
             "reduce op check (_is_sum)": lambda: be._is_sum(opts),
             "work for the call (_work)": lambda: g._work([x], opts),
             "new TritonCommWork": lambda: be.TritonCommWork([x]), "new dist.Work": lambda: dist.Work(),
             "AllreduceOptions()": lambda: dist.AllreduceOptions()}
    for name, fn in parts.items():
        rows[f"part: {name}"] = host_us(fn, n, ctx.device)
    ctx.barrier()
    rows["nccl dist.all_reduce"] = host_us(lambda: dist.all_reduce(x, group=ctx.group), n, ctx.device)
    prof = profile_text(lambda: dist.all_reduce(x, group=g), n, 20) if ctx.rank == 0 else None
    if comm is not None:
        real.close()
        g.ar, g.comm = None, None
        comm.close()
    dist.destroy_process_group(g)
    return {"rank": ctx.rank, "host_us_per_call": rows, "profile_rank0": prof}


if __name__ == "__main__":
    main_for(dispatch_rank, 2000)
