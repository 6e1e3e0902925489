"""Experiment: where the Lamport one-shot's call check spends its time. The same calls with the check
off, on (as shipped), on without the header reset (and its CTA barrier), with headers stored but never
looked at; each also with one header per 128-byte line instead of 16 per line. CUDA graphs, max over
ranks, interleaved repetitions, median. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/check_cost.py --world 2
"""

from __future__ import annotations

import argparse
import json

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce
from tritoncomm.collectives.allreduce.lamport import LamportOneShot
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.tools.report import max_over_ranks
from tritoncomm.tools.timing import time_per_call_us
from tritoncomm.units import parse_size

MODES = {"shipped": 0, "look_only": 7, "logic_only": 8, "store_only": 2}


def cost_rank(ctx, sizes: list[int], reps: int) -> dict | None:
    big = max(sizes)
    heap = 8 * big + (64 << 20)
    rows = []
    for nbytes in sizes:  # fresh instances per size: the variants without a reset leave headers behind
        ars = {}
        for pad in (1,):
            LamportOneShot.hpad = pad
            ars[pad] = AllReduce(Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap)), max_bytes=big)
        LamportOneShot.hpad = 1
        ars["off"] = AllReduce(Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap, check_calls=False)),
                               max_bytes=big)
        x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
        out = torch.empty_like(x)
        ref = ars["off"](x).clone()
        variants = {"off": (ars["off"], 0)}
        for pad in (1,):
            for name, m in MODES.items():
                variants[f"{name}_pad{pad}"] = (ars[pad], m)
        same = True
        for ar, m in variants.values():
            ar.algorithm("lamport").hdr_mode = m
            same = same and torch.equal(ar(x), ref)
        samples: dict[str, list[float]] = {}
        for _ in range(reps):
            for name, (ar, m) in variants.items():
                ar.algorithm("lamport").hdr_mode = m
                samples.setdefault(name, []).append(
                    time_per_call_us(lambda ar=ar, x=x, out=out: ar(x, out), ctx.device, ctx.barrier, replays=10))
        t = max_over_ranks(ctx, {k: sorted(v)[len(v) // 2] for k, v in samples.items()})
        rows.append({"bytes": nbytes, "algo": ars["off"].select(nbytes), "same_bits": same, **t})
        if ctx.rank == 0:
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                  flush=True)
        for ar in ars.values():
            comm = ar.comm
            ar.close()
            comm.close()
    if ctx.rank != 0:
        return None
    import triton
    return {"world": ctx.world, "device": torch.cuda.get_device_name(ctx.device), "torch": torch.__version__,
            "triton": triton.__version__, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="8K,64K,256K,1M,2M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rep = launch(cost_rank, a.world, sizes, a.reps, timeout=560)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
