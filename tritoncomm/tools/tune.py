"""``tune``: measure the candidate algorithms and launch shapes on this machine and write the table.

For each size, every candidate (algorithm x programs x block x warps) runs in a CUDA graph (32
calls, median of replays, max over ranks); the fastest wins. Rank 0 decides from the gathered
times and broadcasts the table, so every rank holds the same one. Rows are tuned on one dtype
(bf16 by default) and written for all three: the kernels move bytes, and fp16 moves the same
bytes; fp32 is close enough to reuse, and a tune run with ``--dtype fp32`` refines it.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import AllGather, AllReduce, Choice, ReduceScatter, SelectionTable
from ..collectives.selection import DTYPES as DTYPE_KEYS
from ..config import CommConfig
from ..launch import RankContext
from ..units import NO_LIMIT
from .report import DTYPES
from .timing import time_per_call_us

__all__ = ["COLLECTIVES", "MAX_BARRIER_PROGRAMS", "MAX_BARRIER_WARPS", "candidates", "tune_rank"]

#: The collectives ``tune`` measures, by table op.
COLLECTIVES = {"allreduce": AllReduce, "allgather": AllGather, "reducescatter": ReduceScatter}


#: Grids of kernels with cross-rank barriers stay at or below this many warps (programs x warps) and
#: this many programs: the grids up to them ran without a slow timing under the first-warp barrier
#: (``docs/algorithms.md``, "Barrier grids"; ``benchmarks/experiments/stall_probe.py``), and past 64
#: programs and 512 warps rare 10-30x slow timings were measured on H200 with every warp polling.
#: Every algorithm's ``candidates`` keeps to them (tested).
MAX_BARRIER_WARPS = 1024
MAX_BARRIER_PROGRAMS = 128


def candidates(op: str, nbytes: int, backend: str) -> list[Choice]:
    """Launch shapes worth trying for a message of ``nbytes``: every algorithm of ``op``'s registry
    says its own (``Algorithm.candidates``)."""
    out = {c for algo in COLLECTIVES[op].ALGORITHMS.values() for c in algo.candidates(nbytes, backend)}
    return sorted(out, key=lambda c: (c.algo, c.programs, c.block, c.num_warps))


def tune_rank(ctx: RankContext, ops: list[str], sizes: list[int], dtype_name: str) -> dict[str, Any] | None:
    dtype = DTYPES[dtype_name]
    esize = torch.tensor([], dtype=dtype).element_size()
    w = ctx.world
    max_bytes = max(sizes)
    caps: dict[str, int] = {}
    for s in sizes:
        for c in candidates("allreduce", s, "cuda" if ctx.backend == "cuda" else "cpu"):
            caps[c.algo] = max(caps.get(c.algo, 0), s)
    # every algorithm sized for the largest size it is tried at: up to 4 x W x that (LL, Lamport one-shot)
    need = sum(4 * w * c for c in caps.values()) if "allreduce" in ops else 0
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=max(need, 3 * max_bytes) + (64 << 20),
                                                         timeout_s=60))
    all_cands = {op: sorted({c for s in sizes for c in candidates(op, s, comm.backend)},
                            key=lambda c: (c.algo, c.programs, c.block, c.num_warps)) for op in ops}

    rows: dict[tuple[str, int, str], list[tuple[int, Choice]]] = {}
    measured: list[dict[str, Any]] = []
    for op in ops:
        # A table listing every candidate sizes the channels (grids, capacities) for all of them.
        grid_table = SelectionTable({(op, w, d): [(i + 1, c) for i, c in enumerate(all_cands[op])]
                                     for d in DTYPE_KEYS}, "tune candidates")
        if op == "allreduce":
            coll: Any = AllReduce(comm, max_bytes=max_bytes, table=grid_table, algos=caps)
        elif op == "allgather":
            coll = AllGather(comm, max_bytes=max_bytes, table=grid_table)
        else:
            coll = ReduceScatter(comm, max_bytes=max_bytes, table=grid_table)
        picks: list[tuple[int, Choice]] = []
        for nbytes in sizes:
            n = max(w, nbytes // esize // w * w)
            x = torch.randn(n if op != "allgather" else n // w, device=ctx.device).to(dtype)
            out = torch.empty(n if op != "reducescatter" else n // w, dtype=dtype, device=ctx.device)
            times = {}
            for c in candidates(op, nbytes, comm.backend):
                if op == "allreduce" and nbytes > coll.capacity.get(c.algo, -1):
                    continue
                # the same candidate on every rank: the candidate list is a function of the size alone
                coll.table = SelectionTable({(op, w, d): [(NO_LIMIT, c)] for d in DTYPE_KEYS}, "candidate")
                times[c] = time_per_call_us(lambda x=x, out=out, coll=coll: coll(x, out), ctx.device, ctx.barrier,
                                            replays=10)
            gathered: list[Any] = [None] * w
            dist.all_gather_object(gathered, {repr(c): t for c, t in times.items()}, group=ctx.cpu_group)
            worst = {c: max(g[repr(c)] for g in gathered) for c in times}
            best = min(worst, key=lambda c: worst[c])
            picks.append((nbytes, best))
            measured.append({"op": op, "world": w, "bytes": nbytes, "best": repr(best), "best_us": worst[best],
                             "candidates": {repr(c): t for c, t in worst.items()}})
            if ctx.rank == 0:  # progress, so that a run cut short still shows what it measured
                print(f"tune {op} world {w} {nbytes} B: {worst[best]:.1f} us {best}", flush=True)
        coll.table = grid_table
        coll.close()
        # merge neighbouring sizes with the same choice; the last row serves everything larger
        merged: list[tuple[int, Choice]] = []
        for nbytes, c in picks:
            if merged and merged[-1][1] == c:
                merged[-1] = (nbytes, c)
            else:
                merged.append((nbytes, c))
        for d in DTYPE_KEYS:
            rows[(op, w, d)] = merged
    comm.close()
    table = SelectionTable(rows, "tune")
    if ctx.rank != 0:
        return None
    return {"table": table.to_json(), "measured": measured, "world": w,
            "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world",
            "date": datetime.date.today().isoformat(), "dtype": dtype_name}
