"""Experiment: does the LL two-shot's time depend on how its buffers are sized or placed in the heap?
Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/layout_probe.py --world 2 --json layout.json

Session 8 measured the LL two-shot 1.3-1.5 µs slower in an experiment whose instances were sized
for 512 KB than in the session-7 bench (sized for 1-4 MB), while the LL one-shot matched. Here, in
one run, CUDA graphs, max over ranks: the bare LL two-shot at 256 KB and 512 KB from instances
sized for 512 KB .. 4 MB, timed in one order and again in reverse; an instance placed after a
1 MB + 256 B pad; the fused LL two-shot at 8 and 32 tokens from instances sized for 32 / 256 / 2048
tokens, the fused LL with rows in 4 or 8 chunks, the fused one-shot. Every bare output checked against NCCL first.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, FusedAllReduceAddRMSNorm
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us


def probe_rank(ctx) -> dict | None:
    dev = ctx.device
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=1 << 30, timeout_s=60))
    inst: dict[str, AllReduce] = {}
    for cap in (512 << 10, 1 << 20, 2 << 20, 4 << 20):
        inst[f"cap{cap >> 10}K"] = AllReduce(comm, max_bytes=cap, algos={"ll_twoshot": cap}, name=f"lp{cap}")
    pad = comm.heap.alloc((1 << 20) + 256, "lp.pad")
    inst["cap512K+pad"] = AllReduce(comm, max_bytes=512 << 10, algos={"ll_twoshot": 512 << 10}, name="lp.pad512")
    offs = {k: a._channels["ll_twoshot"].buffer_off for k, a in inst.items()}
    fused = {f"ll_twoshot max{t}": (FusedAllReduceAddRMSNorm(comm, t, 8192, algos=("ll_twoshot",), name=f"lpf{t}"),
                                    "ll_twoshot") for t in (32, 64, 2048)}
    for c in (4, 8):
        fused[f"ll ch<={c}"] = (FusedAllReduceAddRMSNorm(comm, 32, 8192, algos=("ll",), max_chunks=c,
                                                         name=f"lpl{c}"), "ll")
    fused["oneshot"] = (FusedAllReduceAddRMSNorm(comm, 32, 8192, algos=("oneshot",), name="lpo"), "oneshot")
    results: dict[str, float] = {}
    ok = True
    for nbytes in (256 << 10, 512 << 10):
        n = nbytes // 2
        x = torch.randn(n, device=dev, generator=torch.Generator(device=dev).manual_seed(n + ctx.rank))
        x = x.to(torch.bfloat16)
        ref = x.clone()
        dist.all_reduce(ref, group=ctx.group)
        out = torch.empty_like(x)
        for a in inst.values():
            out.fill_(float("nan"))
            a(x, out=out, algo="ll_twoshot")
            ok = ok and bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2))
        for order in ("fwd", "rev"):
            keys = list(inst) if order == "fwd" else list(reversed(inst))
            for k in keys:
                results[f"bare {nbytes >> 10}K {k} {order}"] = time_per_call_us(
                    lambda a=inst[k], x=x, out=out: a(x, out=out, algo="ll_twoshot"), dev, ctx.barrier)
    h = 8192
    w = torch.rand(h, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).to(torch.bfloat16) + 0.5
    for t in (8, 32):
        x = torch.randn(t, h, device=dev, generator=torch.Generator(device=dev).manual_seed(t + ctx.rank))
        x = x.to(torch.bfloat16)
        res0 = torch.randn(t, h, device=dev, generator=torch.Generator(device=dev).manual_seed(t)).to(torch.bfloat16)
        out = torch.empty_like(x)
        for order in ("fwd", "rev"):
            keys = list(fused) if order == "fwd" else list(reversed(fused))
            for k in keys:
                res = res0.clone()
                f, algo = fused[k]
                results[f"fused {t}tok {k} {order}"] = time_per_call_us(
                    lambda f=f, algo=algo, x=x, res=res, out=out: f(x, res, w, out=out, algo=algo), dev, ctx.barrier)
    m = _max_over_ranks(ctx, results)
    oks = [None] * ctx.world
    dist.all_gather_object(oks, ok, group=ctx.cpu_group)
    if ctx.rank == 0:
        print("buffer offsets:", offs)
        for k, v in m.items():
            print(f"{k:40s} {v:7.2f}", flush=True)
        print("correct:", all(oks))
    for f, _ in fused.values():
        f.close()
    for a in inst.values():
        a.close()
    comm.heap.free(pad)
    comm.close()
    if ctx.rank != 0:
        return None
    return {"device": torch.cuda.get_device_name(dev), "world": ctx.world, "offsets": offs, "us": m,
            "correct": all(oks)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = launch(probe_rank, a.world, backend="cuda")[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
