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

from .channels import Communicator
from .collectives import AllGather, AllReduce, Choice, ReduceScatter, SelectionTable
from .collectives.tuning import DTYPE_NAMES
from .config import CommConfig
from .launch import RankContext
from .timing import time_per_call_us

__all__ = ["MAX_BARRIER_PROGRAMS", "MAX_BARRIER_WARPS", "candidates", "tune_rank"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


#: Grids of kernels with cross-rank barriers stay at or below this many warps (programs x warps).
#: Measured on 4xH200 (2026-11-21, benchmarks/experiments/stall_probe.py, 16 MB at TP4, 12 rounds):
#: 128 programs x 8 warps was 17-18x slow in 5 of 12 graph timings, 128 x 16 26x in 2 of 12, 64 x 8
#: in none (NCCL in none); in the sweep before, 128-program shapes were 3-100x slow in 4 timings and
#: 64 x 16 1.8-2.7x in 2. Cause not found; the fastest shapes past the cap were only 2-10% faster
#: when they were not slow. 128 programs x 4 warps (512 warps, within the cap) also stalled once
#: (one-shot, 4 MB, TP2: 412 µs against a median of 24.7; benchmarks/experiments/midsize_shapes.py),
#: so grids stay at ``MAX_BARRIER_PROGRAMS`` programs or fewer too. The caps make stalls rarer, not
#: impossible: the shipped 64 x 8 one-shot stalled once in a full bench run (256 KB TP4, 412 µs per
#: call for the whole timing, 8.0 in the re-run; benchmarks/NOTES.md, session 4).
MAX_BARRIER_WARPS = 512
MAX_BARRIER_PROGRAMS = 64


def candidates(op: str, nbytes: int, backend: str) -> list[Choice]:
    """Launch shapes worth trying for a message of ``nbytes`` (``MAX_BARRIER_WARPS`` and
    ``MAX_BARRIER_PROGRAMS`` hold)."""
    if backend != "cuda":
        if op == "allreduce":
            out = [Choice("oneshot", 2, 2048, 1), Choice("twoshot", 2, 2048, 1), Choice("pipelined", 2, 1024, 1)]
            return ([Choice("ll", 2, 1024, 1)] if nbytes <= 64 << 10 else []) + out
        return [Choice("push", 2, 2048, 1)]
    out: list[Choice] = []
    if op == "allreduce":
        words = -(-nbytes // 4)
        if nbytes <= 1 << 20:
            for block in (256, 1024):
                for progs in (4, 16, 32):
                    p = min(progs, -(-words // block))
                    out.append(Choice("ll", p, block, 4))
        if 16 << 10 <= nbytes <= 4 << 20:  # LL two-shot: no barrier, half the LL one-shot's bytes at TP4
            # more programs, more blocks in flight: 4xH200 (2026-11-22) 512 KB TP4 22.2 / 12.5 / 9.5 µs
            # with 16 / 32 / 64 programs of 256 words. No barrier, so the barrier caps do not apply.
            for block, warps in ((256, 4), (1024, 8)):
                for progs in (16, 32, 64, 128):
                    out.append(Choice("ll_twoshot", min(progs, -(-words // block)), block, warps))
        if nbytes <= 32 << 20:
            for block in (2048, 8192):
                for progs in (8, 32, 64):
                    out.append(Choice("oneshot", min(progs, max(1, nbytes // 2 // block)), block, 8))
        if nbytes >= 32 << 10:
            for block in (2048, 8192):
                for progs in (32, 64):
                    out.append(Choice("twoshot", min(progs, max(1, nbytes // 2 // block)), block, 8))
        if 32 << 10 <= nbytes <= 8 << 20:  # small blocks: more programs busy on a small shard
            for progs in (32, 64):
                out.append(Choice("twoshot", min(progs, max(1, nbytes // 2 // 1024)), 1024, 4))
        if nbytes >= 4 << 20:
            for block in (4096, 16384):
                out.append(Choice("twoshot", 64, block, 8))
        # The pipelined two-shot never won a measurement (benchmarks/NOTES.md); it stays selectable by
        # name (``algo="pipelined"``) but is no longer a tuning candidate.
    else:
        for block in (1024, 4096):
            for progs in (8, 32, 64):
                out.append(Choice("push", min(progs, max(1, nbytes // 2 // block)), block, 8 if block > 1024 else 4))
    assert all(c.programs * c.num_warps <= MAX_BARRIER_WARPS and c.programs <= MAX_BARRIER_PROGRAMS
               for c in out if c.algo not in ("ll", "ll_twoshot"))
    return sorted(set(out), key=lambda c: (c.algo, c.programs, c.block, c.num_warps))


def tune_rank(ctx: RankContext, ops: list[str], sizes: list[int], dtype_name: str) -> dict[str, Any] | None:
    dtype = DTYPES[dtype_name]
    esize = torch.tensor([], dtype=dtype).element_size()
    w = ctx.world
    max_bytes = max(sizes)
    caps: dict[str, int] = {}
    for s in sizes:
        for c in candidates("allreduce", s, "cuda" if ctx.backend == "cuda" else "cpu"):
            caps[c.algo] = max(caps.get(c.algo, 0), s)
    need = 2 * sum(caps.values()) + 8 * w * (1 << 20) if "allreduce" in ops else 0
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=max(need, 3 * max_bytes) + (64 << 20),
                                                         timeout_s=60))
    all_cands = {op: sorted({c for s in sizes for c in candidates(op, s, comm.backend)},
                            key=lambda c: (c.algo, c.programs, c.block, c.num_warps)) for op in ops}

    rows: dict[tuple[str, int, str], list[tuple[int, Choice]]] = {}
    measured: list[dict[str, Any]] = []
    for op in ops:
        # A table listing every candidate sizes the channels (grids, capacities) for all of them.
        grid_table = SelectionTable({(op, w, d): [(i + 1, c) for i, c in enumerate(all_cands[op])]
                                     for d in DTYPE_NAMES}, "tune candidates")
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
                coll.table = SelectionTable({(op, w, d): [(1 << 62, c)] for d in DTYPE_NAMES}, "candidate")
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
        for d in DTYPE_NAMES:
            rows[(op, w, d)] = merged
    comm.close()
    table = SelectionTable(rows, "tune")
    if ctx.rank != 0:
        return None
    return {"table": table.to_json(), "measured": measured, "world": w,
            "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world",
            "date": datetime.date.today().isoformat(), "dtype": dtype_name}
