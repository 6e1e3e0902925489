"""Experiment: vLLM's default expert-parallel exchange (``AgRsAll2AllManager``: ``all_gatherv`` of the
hidden states, fp32 top-k weights and int32 ids, then ``reduce_scatterv`` of the experts' outputs)
through tritoncomm's ``DataParallelGatherScatter`` (what the vLLM plugin builds) against NCCL's uneven
list all-gather and reduce-scatter (torch.distributed; vLLM's pynccl groups the same NCCL calls), with
a different token count per rank; also tritoncomm at equal counts (the equal-shard kernels). CUDA
graphs, max over ranks, median of interleaved repetitions. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/gatherv.py --world 2 --tokens 8,128,1024
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from tritoncomm.integrations.vllm_agrs import DataParallelGatherScatter
from tritoncomm.launch import launch
from tritoncomm.tools.report import max_over_ranks
from tritoncomm.tools.timing import time_per_call_us


def gatherv_rank(ctx, tokens: list[int], hidden: int, top_k: int, reps: int) -> dict | None:
    ours = DataParallelGatherScatter(ctx.cpu_group, ctx.device)
    rows = []
    for t in tokens:
        uneven = [max(1, t - t // 4 * r) for r in range(ctx.world)]  # rank r: a quarter fewer per rank
        for label, sizes in (("uneven", uneven), ("equal", [t] * ctx.world)):
            n, total = sizes[ctx.rank], sum(sizes)
            x = torch.randn(n, hidden, device=ctx.device).to(torch.bfloat16)
            w = torch.rand(n, top_k, device=ctx.device)
            ids = torch.randint(0, 256, (n, top_k), device=ctx.device, dtype=torch.int32)
            y = torch.randn(total, hidden, device=ctx.device).to(torch.bfloat16)
            outs = [[torch.empty(s, *v.shape[1:], dtype=v.dtype, device=ctx.device) for s in sizes]
                    for v in (x, w, ids)]
            rs_out = torch.empty(n, hidden, dtype=torch.bfloat16, device=ctx.device)
            rs_in = list(y.split(sizes))

            def tc() -> None:
                ours.all_gatherv([x, w, ids], sizes)  # noqa: B023
                ours.reduce_scatterv(y, sizes, rs_out)  # noqa: B023

            def nccl() -> None:
                for o, v in zip(outs, (x, w, ids), strict=True):  # noqa: B023
                    dist.all_gather(o, v, group=ctx.group)
                dist.reduce_scatter(rs_out, rs_in, group=ctx.group)  # noqa: B023

            served = ours.all_gatherv([x, w, ids], sizes) is not None
            samples: dict[str, list[float]] = {}
            for _ in range(reps):
                samples.setdefault("tritoncomm", []).append(time_per_call_us(tc, ctx.device, ctx.barrier, replays=10))
                samples.setdefault("nccl", []).append(time_per_call_us(nccl, ctx.device, ctx.barrier, replays=10))
            row = {"tokens": t, "sizes": sizes, "served": served,
                   **max_over_ranks(ctx, {k: sorted(v)[len(v) // 2] for k, v in samples.items()})}
            rows.append(row)
            if ctx.rank == 0:
                print(label, row, flush=True)
    ours.close()
    return {"world": ctx.world, "hidden": hidden, "rows": rows} if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", default="8,128,512,1024")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rep = launch(gatherv_rank, a.world, [int(t) for t in a.tokens.split(",")], a.hidden, a.top_k, a.reps,
                 timeout=560)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
