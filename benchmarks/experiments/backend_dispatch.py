"""Experiment: where does an eager ``dist.all_reduce`` through the tritoncomm backend spend its host
time? Host microseconds per call (``n`` calls back to back, then one synchronize; 8 KB bf16) of: the
group's ``AllReduce`` called directly, the group's ``allreduce`` method, ``dist.all_reduce`` on the group,
the same three with the collective replaced by a Python no-op (pure dispatch), and NCCL; then rank 0's
cProfile of ``dist.all_reduce`` on the group. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/backend_dispatch.py --world 2
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from hosttime import host_us, main_for, profile_text  # benchmarks/experiments/, the script's directory

from tritoncomm.integrations.backend import register


class _NoOp:
    max_bytes = 1 << 30

    def __call__(self, x, out):
        return out

    def close(self) -> None:
        pass


def dispatch_rank(ctx, n: int) -> dict | None:
    register()
    g = dist.new_group(backend="tritoncomm")
    if g.ar is None:  # a group of one rank delegates everything
        raise RuntimeError("backend_dispatch.py needs a group the backend serves: --world 2 or more")
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
            rows[f"{label} {name}"] = host_us(fn, n, ctx.device)
    ctx.barrier()
    rows["nccl dist.all_reduce"] = host_us(lambda: dist.all_reduce(x, group=ctx.group), n, ctx.device)
    prof = profile_text(lambda: dist.all_reduce(x, group=g), n, 20) if ctx.rank == 0 else None
    dist.destroy_process_group(g)
    return {"rank": ctx.rank, "host_us_per_call": rows, "profile_rank0": prof}


if __name__ == "__main__":
    main_for(dispatch_rank, 2000)
