"""Experiment: does running the two-shot in rounds (copy-out of round c-1 behind round c's pushes)
pay, per size? The table's launch shape, rounds forced to 1, 2 and 4, NCCL beside; CUDA graphs,
max over ranks, three interleaved repetitions (rounds forced through ``Choice.rounds``). Not part of
the library:

    PYTHONPATH=. python3 benchmarks/experiments/twoshot_rounds.py --world 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.distributed as dist

from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, SelectionTable
from tritoncomm.collectives.selection import DTYPES
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.tools.report import max_over_ranks
from tritoncomm.tools.timing import time_per_call_us
from tritoncomm.units import parse_size


def rounds_rank(ctx, sizes: list[int], reps: int) -> dict | None:
    big = max(sizes)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=3 * big + (64 << 20), timeout_s=60))
    ar = AllReduce(comm, max_bytes=big)
    shipped = ar.table

    def with_rounds(nbytes: int, rounds: int) -> SelectionTable:  # the shipped shape at this size, these rounds
        c = shipped.lookup("allreduce", ctx.world, "bf16", nbytes)
        return SelectionTable({("allreduce", ctx.world, d): [(1 << 62, dataclasses.replace(c, rounds=rounds))]
                               for d in DTYPES}, f"rounds={rounds}")

    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
        out = torch.empty_like(x)
        nb = x.clone()
        bits = {}
        for r in (1, 2, 4):
            ar.table = with_rounds(nbytes, r)
            bits[r] = ar(x, out).clone()
        same = all(torch.equal(bits[1], bits[r]) for r in bits)
        samples: dict[str, list[float]] = {}
        for _ in range(reps):
            for r in (1, 2, 4):
                ar.table = with_rounds(nbytes, r)
                samples.setdefault(f"rounds{r}", []).append(
                    time_per_call_us(lambda: ar(x, out), ctx.device, ctx.barrier, replays=10))  # noqa: B023
            samples.setdefault("nccl", []).append(
                time_per_call_us(lambda: dist.all_reduce(nb, group=ctx.group), ctx.device, ctx.barrier, replays=10))  # noqa: B023
        t = max_over_ranks(ctx, {k: sorted(v)[len(v) // 2] for k, v in samples.items()})
        rows.append({"bytes": nbytes, "algo": shipped.lookup("allreduce", ctx.world, "bf16", nbytes).algo,
                     "same_bits": same, **t})
        if ctx.rank == 0:
            print(rows[-1], flush=True)
    ar.close()
    comm.close()
    return {"world": ctx.world, "rows": rows} if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="4M,8M,16M,32M,64M,128M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rep = launch(rounds_rank, a.world, sizes, a.reps, timeout=560)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
