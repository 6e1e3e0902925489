"""Experiment: where the fused LL add-RMSNorm spends its time at decode sizes. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/fused_sweep.py --world 2 --json sweep.json

Hidden 8192, bf16, tokens 1 / 8 / 32, CUDA graphs, max over ranks, one run: the bare all-reduce
(the table's choice and the LL one-shot) of the same bytes; the fused LL variant with rows cut
into 1..16 chunks (``max_chunks``); the fused LL two-shot with 64 and 128 programs; the fused
one-shot. Every variant's output is checked against NCCL + torch before it is timed.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, FusedAllReduceAddRMSNorm
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us


def sweep_rank(ctx, tokens: list[int], h: int = 8192) -> dict | None:
    dev = ctx.device
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=512 << 20, timeout_s=60))
    mt = max(tokens)
    ar = AllReduce(comm, max_bytes=mt * h * 2, name="sw.ar")
    ops: dict[str, tuple[FusedAllReduceAddRMSNorm, str]] = {}
    for ch in (1, 2, 4, 8, 16):
        ops[f"ll ch<={ch}"] = (FusedAllReduceAddRMSNorm(comm, mt, h, algos=("ll",), max_chunks=ch,
                                                        name=f"sw.ll{ch}"), "ll")
    for p in (64, 128):
        ops[f"ll_twoshot p{p}"] = (FusedAllReduceAddRMSNorm(comm, mt, h, algos=("ll_twoshot",), programs=p,
                                                            name=f"sw.l2{p}"), "ll_twoshot")
    ops["oneshot p64"] = (FusedAllReduceAddRMSNorm(comm, mt, h, algos=("oneshot",), name="sw.os"), "oneshot")
    rows = []
    for t in tokens:
        g = torch.Generator(device=dev).manual_seed(t + 17 * ctx.rank)
        x = torch.randn(t, h, device=dev, generator=g).to(torch.bfloat16)
        res0 = torch.randn(t, h, device=dev, generator=torch.Generator(device=dev).manual_seed(t)).to(torch.bfloat16)
        w = torch.rand(h, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).to(torch.bfloat16) + 0.5
        xb, rb = x.clone(), res0.clone()
        dist.all_reduce(xb, group=ctx.group)
        rb.add_(xb)
        yb = F.rms_norm(rb, (h,), w, 1e-6)
        times, oks = {}, {}
        out, xo = torch.empty_like(x), torch.empty_like(x)
        times["bare table"] = time_per_call_us(lambda x=x, xo=xo: ar(x, out=xo), dev, ctx.barrier)
        if t * h * 2 <= ar.capacity.get("ll", 0):
            times["bare ll"] = time_per_call_us(lambda x=x, xo=xo: ar(x, out=xo, algo="ll"), dev, ctx.barrier)
        for name, (op, algo) in ops.items():
            if t * h * 2 > op.capacity.get(algo, 0):
                continue
            out.fill_(float("nan"))
            y = op(x, res0.clone(), w, out=out, algo=algo)
            oks[name] = bool(torch.allclose(y.float(), yb.float(), rtol=3e-2, atol=3e-2))
            res = res0.clone()
            times[name] = time_per_call_us(
                lambda op=op, algo=algo, x=x, res=res, w=w, out=out: op(x, res, w, out=out, algo=algo), dev,
                ctx.barrier)
        m = _max_over_ranks(ctx, times)
        allok = [None] * ctx.world
        dist.all_gather_object(allok, oks, group=ctx.cpu_group)
        ok = {k: all(o[k] for o in allok) for k in oks}
        rows.append({"tokens": t, "us": m, "ok": ok})
        if ctx.rank == 0:
            print(f"tokens {t}: " + ", ".join(f"{k} {v:.2f}" + ("" if ok.get(k, True) else " WRONG")
                                              for k, v in m.items()), flush=True)
    for op, _ in ops.values():
        op.close()
    ar.close()
    comm.close()
    if ctx.rank != 0:
        return None
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU world"
    return {"device": device, "world": ctx.world, "hidden": h, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = launch(sweep_rank, a.world, [int(t) for t in a.tokens.split(",")], a.hidden, backend=a.backend)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
