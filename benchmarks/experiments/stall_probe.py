"""Experiment: how often does an all-reduce launch shape hit the rare 10-30x slow measurements seen in
sweeps and benches, and does NCCL hit them too? Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/stall_probe.py --world 4 --bytes 16M --rounds 12 \
        [--shapes 64x8192x8,128x2048x8]

Each round times every shape (and NCCL) once, interleaved, in CUDA graphs (32 calls, median of 5
replays per rank); prints each rank's time so a slow rank shows.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, Choice, SelectionTable
from tritoncomm.collectives.selection import DTYPES
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.tools.timing import time_per_call_us
from tritoncomm.units import parse_size

#: Two-shot launch shapes, programs x block x warps.
SHAPES = "64x8192x8,64x2048x8,128x2048x8,128x8192x16"


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """``"64x8192x8,128x2048x8"`` -> ``[(64, 8192, 8), (128, 2048, 8)]``."""
    out = []
    for part in spec.split(","):
        p, b, nw = (int(v) for v in part.split("x"))
        out.append((p, b, nw))
    return out


def probe_rank(ctx, nbytes: int, rounds: int, shapes: list[tuple[int, int, int]]) -> dict | None:
    w = ctx.world
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=3 * nbytes + (64 << 20), timeout_s=60))
    cands = [Choice("twoshot", p, b, nw) for p, b, nw in shapes]
    ar = AllReduce(comm, max_bytes=nbytes, algos={"twoshot": nbytes},
                   table=SelectionTable({("allreduce", w, d): [(i + 1, c) for i, c in enumerate(cands)]
                                         for d in DTYPES}, "probe"))
    x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
    out = torch.empty_like(x)
    nb = x.clone()

    log = []
    for r in range(rounds):
        t = {}
        for c in cands:
            ar.table = SelectionTable({("allreduce", w, d): [(1 << 62, c)] for d in DTYPES}, "one")
            key = f"p{c.programs} b{c.block} w{c.num_warps}"
            t[key] = time_per_call_us(lambda: ar(x, out), ctx.device, ctx.barrier, replays=5)
            if r % 3 == 0:
                t[key + " eager"] = time_per_call_us(lambda: ar(x, out), ctx.device, ctx.barrier, replays=5,
                                                     mode="eager")
        t["nccl"] = time_per_call_us(lambda: dist.all_reduce(nb, group=ctx.group), ctx.device, ctx.barrier, replays=5)
        allt: list = [None] * w
        dist.all_gather_object(allt, t, group=ctx.cpu_group)
        log.append(allt)
        if ctx.rank == 0:
            print(f"round {r}: " + "; ".join(f"{k}=" + "/".join(f"{a[k]:.0f}" for a in allt) for k in t), flush=True)
    ar.close()
    comm.close()
    return {"world": w, "bytes": nbytes, "rounds": log} if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--bytes", default="16M")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--shapes", default=SHAPES, help="two-shot shapes, programs x block x warps, comma-separated")
    ap.add_argument("--json")
    a = ap.parse_args()
    nbytes = parse_size(a.bytes)
    rep = launch(probe_rank, a.world, nbytes, a.rounds, parse_shapes(a.shapes), timeout=560)[0]
    keys = list(rep["rounds"][0][0])
    for k in keys:
        per = [max(rank[k] for rank in rnd) for rnd in rep["rounds"] if k in rnd[0]]
        med = sorted(per)[len(per) // 2]
        slow = sum(v > 3 * med for v in per)
        print(f"{k:24s} median {med:8.1f} us  slow (>3x median) {slow}/{len(per)}  max {max(per):9.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f)


if __name__ == "__main__":
    main()
