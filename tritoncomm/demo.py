"""The main job: all-reduce correctness and timing on local ranks, next to torch.distributed.

For each size, every algorithm that can serve it runs on random data (a fresh draw per rank) into
a NaN-poisoned output, and is checked against torch.distributed's all-reduce of the same data
(fp32 sum) and for identical bytes on every rank. Then tritoncomm and the baseline (NCCL on GPUs,
gloo in the CPU world) are timed the same way (``timing.time_per_call_us``); each rank's median,
max over ranks.
"""

from __future__ import annotations

import datetime
import json
import platform
from typing import Any

import torch
import torch.distributed as dist

from .channels import Communicator
from .collectives import AllReduce
from .config import CommConfig
from .launch import RankContext
from .timing import time_per_call_us
from .units import format_bytes

__all__ = ["DTYPES", "demo_rank", "format_table"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _digest(t: torch.Tensor) -> int:
    b = t.detach().contiguous().view(torch.uint8).to(torch.int64)
    w = torch.arange(1, b.numel() + 1, device=b.device, dtype=torch.int64) % 1000003
    return int(((b * w).sum() % (1 << 61)).item())


def demo_rank(ctx: RankContext, sizes: list[int], dtype_name: str, timing: bool = True) -> dict[str, Any] | None:
    """Runs on every rank; rank 0 returns the report."""
    dtype = DTYPES[dtype_name]
    comm = Communicator(ctx.cpu_group, config=CommConfig(timeout_s=60.0))
    ar = AllReduce(comm, max_bytes=max(sizes), algos=("ll", "ll_twoshot", "oneshot", "twoshot", "pipelined"))
    esize = torch.tensor([], dtype=dtype).element_size()

    def cpu_barrier() -> None:
        dist.barrier(group=ctx.cpu_group)

    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // esize)
        g = torch.Generator().manual_seed(1_000_003 * ctx.rank + n)
        x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
        ref = x.float().clone()
        dist.all_reduce(ref, group=ctx.group)
        ref = ref.cpu()
        base_buf = x.clone()
        base_us = time_per_call_us(lambda b=base_buf: dist.all_reduce(b, group=ctx.group), ctx.device,
                                   cpu_barrier) if timing else float("nan")
        algos = [a for a in ar.algorithms if n * esize <= ar.capacity[a]]
        for algo in algos:
            out = torch.full_like(x, float("nan"))
            ar(x, out=out, algo=algo)
            comm.synchronize()
            o = out.float().cpu()
            err = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            digests: list[Any] = [None] * ctx.world
            dist.all_gather_object(digests, _digest(out), group=ctx.cpu_group)
            ok = bool(not torch.isnan(o).any() and err <= TOL[dtype])
            us = time_per_call_us(lambda x=x, out=out, algo=algo: ar(x, out=out, algo=algo), ctx.device,
                                  cpu_barrier) if timing else float("nan")
            comm.synchronize()
            times: list[Any] = [None] * ctx.world
            dist.all_gather_object(times, (us, base_us), group=ctx.cpu_group)
            rows.append({
                "bytes": n * esize, "dtype": dtype_name, "algo": algo, "selected": algo == ar.select(n * esize, dtype),
                "correct": ok, "identical": all(d == digests[0] for d in digests), "max_rel_err": err,
                "tritoncomm_us": max(t[0] for t in times), "baseline_us": max(t[1] for t in times),
            })
    workspace = ar.workspace_bytes
    ar.close()
    comm.close()
    if ctx.rank != 0:
        return None
    if ctx.backend == "cuda":
        device_name = torch.cuda.get_device_name(ctx.device)
    else:
        device_name = f"CPU world ({platform.processor() or platform.machine()}, Triton interpreter)"
    import triton

    return {
        "device": device_name, "date": datetime.date.today().isoformat(), "world": ctx.world,
        "backend": ctx.backend, "baseline": "nccl" if ctx.backend == "cuda" else "gloo",
        "torch": torch.__version__, "triton": triton.__version__, "workspace_bytes": workspace,
        "timing": "per call, CUDA graph of 32 calls, median of 20 replays, max over ranks"
        if ctx.backend == "cuda" else "per call, median wall clock of synchronous calls, max over ranks",
        "rows": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    base = report["baseline"]
    lines = [
        f"tritoncomm all-reduce: world={report['world']} backend={report['backend']} device={report['device']} "
        f"date={report['date']} torch={report['torch']} triton={report['triton']}",
        f"timing: {report['timing']}; baseline: torch.distributed ({base}) on the same data",
        f"{'bytes':>8} {'dtype':>5} {'algo':>8} {'sel':>3} {'correct':>7} {'same':>4} {'rel_err':>8} "
        f"{'tritoncomm_us':>13} {base + '_us':>10} {'speedup':>7}",
    ]
    for r in report["rows"]:
        sp = r["baseline_us"] / r["tritoncomm_us"] if r["tritoncomm_us"] > 0 else float("nan")
        lines.append(
            f"{format_bytes(r['bytes']):>8} {r['dtype']:>5} {r['algo']:>8} {'*' if r['selected'] else '':>3} "
            f"{'yes' if r['correct'] else 'NO':>7} {'yes' if r['identical'] else 'NO':>4} {r['max_rel_err']:8.1e} "
            f"{r['tritoncomm_us']:13.1f} {r['baseline_us']:10.1f} {sp:7.2f}")
    bad = [r for r in report["rows"] if not (r["correct"] and r["identical"])]
    lines.append(f"{len(report['rows']) - len(bad)}/{len(report['rows'])} checks passed"
                 + ("" if not bad else "  <-- FAILURES"))
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
