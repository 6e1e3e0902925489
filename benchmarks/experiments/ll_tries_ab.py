"""Experiment: the LL receive side before and after ``ll_sum_ranks`` (rounds of back-to-back
``ll8_try`` loads of every peer, one reduction per round) in one run. The previous kernels come from
a copy of the package at the last commit before the change, imported as ``tritoncomm_old``:

    mkdir -p runs/old && git archive <commit> tritoncomm | tar -x -C runs/old
    mv runs/old/tritoncomm runs/old/tritoncomm_old
    PYTHONPATH=. python3 benchmarks/experiments/ll_tries_ab.py --world 4 --old runs/old

Bare LL all-reduce (forced ``algo="ll"``) and the fused LL add-RMSNorm, old and new kernels
interleaved, NCCL beside; CUDA graphs, median of the repetitions per rank, max over ranks. (Session 6
ran it with the fused LL on ``ll_sum_ranks`` too; that measured slower and was reverted, so at later
commits the fused pair compares the same kernel twice.)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import torch
import torch.distributed as dist

import tritoncomm.collectives.allreduce as arm
import tritoncomm.collectives.fused as fm
from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, FusedAllReduceAddRMSNorm
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us
from tritoncomm.units import parse_size


def ab_rank(ctx, sizes: list[int], tokens: list[int], old_root: str, reps: int) -> dict | None:
    sys.path.insert(0, old_root)
    old_ll = importlib.import_module("tritoncomm_old.collectives.allreduce_ll").ll_allreduce_kernel
    old_fll = importlib.import_module("tritoncomm_old.collectives.fused_norm_ll").ll_allreduce_add_rmsnorm_kernel
    new_ll, new_fll = arm.ll_allreduce_kernel, fm.ll_allreduce_add_rmsnorm_kernel
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=64 << 20, timeout_s=60))
    h = 8192
    ar = AllReduce(comm, max_bytes=max(*sizes, max(tokens) * h * 2))
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=max(tokens), max_hidden=h, algos=("ll",))

    def t(fn) -> float:
        return time_per_call_us(fn, ctx.device, ctx.barrier, replays=10)

    rows = []
    for nbytes in (s for s in sizes if s <= ar.capacity.get("ll", 0)):  # the table's LL range
        x = torch.randn(nbytes // 2, device=ctx.device, generator=torch.Generator(ctx.device).manual_seed(ctx.rank))
        x = x.to(torch.bfloat16)
        out = torch.empty_like(x)
        nb = x.clone()
        arm.ll_allreduce_kernel = new_ll
        o_new = ar(x, algo="ll").clone()
        arm.ll_allreduce_kernel = old_ll
        o_old = ar(x, algo="ll").clone()
        ref = x.float()
        dist.all_reduce(ref, group=ctx.group)
        err = ((o_new.float() - ref).abs().max() / ref.abs().max()).item()
        samples: dict[str, list[float]] = {"new": [], "old": [], "nccl": []}
        for _ in range(reps):
            for name, k in (("new", new_ll), ("old", old_ll)):
                arm.ll_allreduce_kernel = k
                samples[name].append(t(lambda: ar(x, out, algo="ll")))  # noqa: B023
            samples["nccl"].append(t(lambda: dist.all_reduce(nb, group=ctx.group)))  # noqa: B023
        arm.ll_allreduce_kernel = new_ll
        m = _max_over_ranks(ctx, {f"{k}_us": sorted(v)[len(v) // 2] for k, v in samples.items()})
        row = {"op": "allreduce_ll", "bytes": nbytes, "same_bits_old_new": bool(torch.equal(o_new, o_old)),
               "err": err, **m}
        rows.append(row)
        if ctx.rank == 0:
            print(row, flush=True)
    g = torch.Generator(ctx.device).manual_seed(5)
    wt = torch.randn(h, device=ctx.device, generator=g).to(torch.bfloat16)
    for tk in tokens:
        x = torch.randn(tk, h, device=ctx.device, generator=torch.Generator(ctx.device).manual_seed(ctx.rank + 9))
        x = x.to(torch.bfloat16)
        res0 = torch.randn(tk, h, device=ctx.device, generator=torch.Generator(ctx.device).manual_seed(3))
        res0 = res0.to(torch.bfloat16)
        res = res0.clone()
        out = torch.empty_like(x)
        outs = {}
        for name, k in (("new", new_fll), ("old", old_fll)):
            fm.ll_allreduce_add_rmsnorm_kernel = k
            r = res0.clone()
            outs[name] = (fused(x, r, wt).clone(), r)
        same = all(torch.equal(a, b) for a, b in zip(outs["new"], outs["old"], strict=True))
        samples = {"new": [], "old": [], "bare": []}
        for _ in range(reps):
            for name, k in (("new", new_fll), ("old", old_fll)):
                fm.ll_allreduce_add_rmsnorm_kernel = k
                samples[name].append(t(lambda: fused(x, res, wt, out=out)))  # noqa: B023
            flat = x.view(-1)
            samples["bare"].append(t(lambda: ar(flat, out.view(-1))))  # noqa: B023
        fm.ll_allreduce_add_rmsnorm_kernel = new_fll
        m = _max_over_ranks(ctx, {f"{k}_us": sorted(v)[len(v) // 2] for k, v in samples.items()})
        row = {"op": "fused_ll", "tokens": tk, "hidden": h, "same_bits_old_new": same, **m}
        rows.append(row)
        if ctx.rank == 0:
            print(row, flush=True)
    fused.close()
    ar.close()
    comm.close()
    dev = torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world"
    return {"world": ctx.world, "device": dev, "rows": rows} \
        if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="2K,8K,16K,32K,64K,128K,256K")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--old", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    tokens = [int(t) for t in a.tokens.split(",")]
    rep = launch(ab_rank, a.world, sizes, tokens, a.old, a.reps, timeout=400)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
