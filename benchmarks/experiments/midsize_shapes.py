"""Experiment: mid-size all-reduce (128 KB - 4 MB) launch shapes and forms, next to torch symm_mem
and NCCL in the same run. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/midsize_shapes.py --world 4 --rounds 3 --json out.json

Question (2026-11-21): at TP4 512 KB - 4 MB torch symm_mem's two-shot (9.7 µs at 512 KB) beats our
table's choice (one-shot 10.7 µs). Do shapes with more, smaller programs (128 x 4 warps, within
``tune.MAX_BARRIER_WARPS``) help, and does the two-shot on symmetric tensors (no copy-out) win
there? Forms: ``reg`` (regular input and output) and ``heap`` (in place on a symmetric tensor,
the setting symm_mem is timed in). Every timing: CUDA graph of 32 calls, median of 5 replays per
rank, max over ranks; rounds interleave everything, so a slow outlier shows as a max far above the
median.
"""

# ruff: noqa: B023  (the closures are timed at once, inside the iteration that made them)

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist

from tritoncomm.bench import _symm_mem_ops
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, Choice, SelectionTable
from tritoncomm.collectives.tuning import DTYPE_NAMES
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us
from tritoncomm.units import parse_size

SHAPES = [("oneshot", 64, 2048, 8), ("oneshot", 128, 1024, 4), ("oneshot", 128, 2048, 4),
          ("twoshot", 32, 2048, 8), ("twoshot", 64, 2048, 8), ("twoshot", 128, 1024, 4), ("twoshot", 128, 2048, 4)]


def _table(w: int, c: Choice) -> SelectionTable:
    return SelectionTable({("allreduce", w, d): [(1 << 62, c)] for d in DTYPE_NAMES}, "one")


def probe_rank(ctx, sizes: list[int], rounds: int) -> dict | None:
    w, dev = ctx.world, ctx.device
    top = max(sizes)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=8 * top + (64 << 20), timeout_s=60))
    cands = [Choice(a, p, b, nw) for a, p, b, nw in SHAPES]
    ar = AllReduce(comm, max_bytes=top, algos={"oneshot": top, "twoshot": top},
                   table=SelectionTable({("allreduce", w, d): [(i + 1, c) for i, c in enumerate(cands)]
                                         for d in DTYPE_NAMES}, "probe"))

    def t_of(fn) -> float:
        us = time_per_call_us(fn, dev, ctx.barrier, replays=5)
        allt: list = [None] * w
        dist.all_gather_object(allt, us, group=ctx.cpu_group)
        return max(allt)

    times: dict[str, dict[str, list[float]]] = {}
    correct: dict[str, bool] = {}
    for n_bytes in sizes:
        n = n_bytes // 2
        g = torch.Generator(device=dev).manual_seed(7 + ctx.rank)
        x = torch.randn(n, device=dev, generator=g).to(torch.bfloat16)
        out = torch.empty_like(x)
        ref = x.clone()
        dist.all_reduce(ref, group=ctx.group)
        xh = comm.empty((n,), torch.bfloat16)
        xh.copy_(x)
        sm = _symm_mem_ops(ctx, n, torch.bfloat16)
        nb = x.clone()
        ts = times.setdefault(str(n_bytes), {})
        for c in cands:  # correctness once per shape and form (poisoned output, fresh data)
            ar.table = _table(w, c)
            out.fill_(float("nan"))
            ar(x, out)
            xh.copy_(x)
            ar(xh, xh)
            ok = bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)) and torch.equal(out, xh)
            correct[f"{n_bytes} {c}"] = ok
        for _ in range(rounds):
            for c in cands:
                ar.table = _table(w, c)
                key = f"{c.algo} p{c.programs} b{c.block} w{c.num_warps}"
                ts.setdefault(key + " reg", []).append(t_of(lambda: ar(x, out)))
                ts.setdefault(key + " heap", []).append(t_of(lambda: ar(xh, xh)))
            for kind in ("one_shot", "two_shot"):
                if kind in sm:
                    ts.setdefault(f"symm_mem {kind}", []).append(t_of(sm[kind]))
            ts.setdefault("nccl", []).append(t_of(lambda: dist.all_reduce(nb, group=ctx.group)))
        if ctx.rank == 0:
            print(f"--- {n_bytes} bytes, world {w} (median / max over {rounds} rounds, µs)", flush=True)
            for k, v in sorted(ts.items(), key=lambda kv: statistics.median(kv[1])):
                print(f"  {k:32s} {statistics.median(v):8.2f} {max(v):8.2f}", flush=True)
        del sm
    bad = [k for k, v in correct.items() if not v]
    allbad: list = [None] * w
    dist.all_gather_object(allbad, bad, group=ctx.cpu_group)
    ar.close()
    comm.close()
    if ctx.rank == 0:
        print("correct everywhere" if not any(allbad) else f"WRONG: {allbad}", flush=True)
        return {"world": w, "rounds": rounds, "times": times, "wrong": allbad}
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="128K,256K,512K,1M,2M,4M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke test of the script only")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    res = launch(probe_rank, a.world, sizes, a.rounds, backend=a.backend, timeout=560)
    if a.json and res and res[0]:
        with open(a.json, "w") as f:
            json.dump(res[0], f, indent=1)


if __name__ == "__main__":
    main()
