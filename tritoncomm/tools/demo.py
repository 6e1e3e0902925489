"""The main job: every all-reduce algorithm checked on local ranks, and on GPUs timed against NCCL.

For each size, every algorithm that can serve it runs on random data (a fresh draw per rank) into
a NaN-poisoned output, and is checked against torch.distributed's all-reduce of the same data
(fp32 sum, over the gloo group) and for identical bytes on every rank. On GPUs, tritoncomm and NCCL
are then timed the same way (``timing.time_per_call_us``: per call in CUDA graphs; each rank's median,
max over ranks). The CPU world is a correctness harness (Triton's interpreter on shared memory), and so
are ranks sharing GPUs: nothing is timed there.
"""

from __future__ import annotations

import datetime
import platform
from typing import Any

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import ALGORITHMS, AllReduce
from ..config import CommConfig
from ..launch import RankContext
from ..units import format_bytes
from .report import DTYPES, TOL, device_name, fmt, max_over_ranks, same_on_all_ranks
from .timing import time_per_call_us

__all__ = ["DTYPES", "demo_rank", "format_table"]


#: What the CPU world's report says instead of times.
CPU_WORLD_NOTE = ("CPU world: the same Triton kernels run in Triton's interpreter on POSIX shared memory, to check "
                  "correctness; its times say nothing about speed, so none are measured (GPUs: NCCL is timed beside)")


#: What the report says when ranks share GPUs.
SHARED_NOTE = ("ranks share GPUs, their kernels time-sliced: correctness only, nothing timed (one rank per GPU "
               "for times)")


def demo_rank(ctx: RankContext, sizes: list[int], dtype_name: str, timing: bool = True) -> dict[str, Any] | None:
    """Runs on every rank; rank 0 returns the report. ``timing`` applies on GPUs only."""
    timing = timing and ctx.backend == "cuda" and not ctx.shared_gpus  # shared GPUs time-slice the ranks
    dtype = DTYPES[dtype_name]
    comm = Communicator(ctx.cpu_group, config=CommConfig(timeout_s=60.0))
    ar = AllReduce(comm, max_bytes=max(sizes), algos=tuple(ALGORITHMS))
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // esize)
        g = torch.Generator().manual_seed(1_000_003 * ctx.rank + n)
        x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
        ref = x.float().cpu()
        dist.all_reduce(ref, group=ctx.cpu_group)  # gloo, in fp32
        base_buf = x.clone()
        base_us = time_per_call_us(lambda b=base_buf: dist.all_reduce(b, group=ctx.group), ctx.device,
                                   ctx.barrier) if timing else None
        for algo in [a for a in ar.algorithms if n * esize <= ar.capacity[a]]:
            out = torch.full_like(x, float("nan"))
            ar(x, out=out, algo=algo)
            comm.synchronize()
            o = out.float().cpu()
            err = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            ok = bool(not torch.isnan(o).any() and err <= TOL[dtype])
            same = same_on_all_ranks(ctx, out)
            row = {"bytes": n * esize, "dtype": dtype_name, "algo": algo, "correct": ok, "identical": same,
                   "selected": algo == ar.select(n * esize, dtype), "max_rel_err": err}
            if timing:
                us = time_per_call_us(lambda x=x, out=out, algo=algo: ar(x, out=out, algo=algo), ctx.device,
                                      ctx.barrier)
                comm.synchronize()
                row.update(max_over_ranks(ctx, {"tritoncomm_us": us, "nccl_us": base_us}))
            rows.append(row)
    workspace = ar.workspace_bytes
    ar.close()
    comm.close()
    if ctx.rank != 0:
        return None
    import triton

    return {
        "device": device_name(ctx) if ctx.backend == "cuda" else
        f"CPU world ({platform.processor() or platform.machine()}, Triton interpreter)",
        "date": datetime.date.today().isoformat(), "world": ctx.world, "backend": ctx.backend,
        "torch": torch.__version__, "triton": triton.__version__, "workspace_bytes": workspace,
        "timing": "per call, CUDA graph of 32 calls, median of 20 replays, max over ranks; baseline NCCL on the "
                  "same data" if timing else (CPU_WORLD_NOTE if ctx.backend != "cuda" else SHARED_NOTE
                                              if ctx.shared_gpus else "not timed"),
        "rows": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    timed = "tritoncomm_us" in report["rows"][0] if report["rows"] else False
    lines = [
        f"tritoncomm all-reduce: world={report['world']} backend={report['backend']} device={report['device']} "
        f"date={report['date']} torch={report['torch']} triton={report['triton']}",
        f"checked against torch.distributed on random data and for identical bytes on every rank; {report['timing']}",
        f"{'bytes':>8} {'dtype':>5} {'algo':>15} {'sel':>3} {'correct':>7} {'same':>4} {'rel_err':>8}"
        + (f" {'tritoncomm_us':>13} {'nccl_us':>8} {'speedup':>7}" if timed else ""),
    ]
    for r in report["rows"]:
        line = (f"{format_bytes(r['bytes']):>8} {r['dtype']:>5} {r['algo']:>15} {'*' if r['selected'] else '':>3} "
                f"{'yes' if r['correct'] else 'NO':>7} {'yes' if r['identical'] else 'NO':>4} {r['max_rel_err']:8.1e}")
        if timed:
            line += f" {fmt(r['tritoncomm_us'], '13.1f')} {fmt(r['nccl_us'], '8.1f')} " + \
                fmt(r["nccl_us"] / r["tritoncomm_us"] if r["tritoncomm_us"] and r["nccl_us"] else None, "7.2f")
        lines.append(line)
    bad = [r for r in report["rows"] if not (r["correct"] and r["identical"])]
    lines.append(f"{len(report['rows']) - len(bad)}/{len(report['rows'])} checks passed"
                 + ("" if not bad else "  <-- FAILURES"))
    return "\n".join(lines)
