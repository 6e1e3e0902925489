"""Experiment: does the two-shot's all-gather pay pulled from the owners' heaps (``PULL``: no
copy-out) rather than pushed into peers' heaps and copied out, for a regular output? Per size: the
pushed form (rounds by the size rule), the pulled form, and, as a floor, a symmetric output (pushed
straight into peers' outputs), with NCCL beside; CUDA graphs, max over ranks, interleaved
repetitions. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/twoshot_pull.py --world 4
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us
from tritoncomm.units import parse_size


def pull_rank(ctx, sizes: list[int], reps: int) -> dict | None:
    torch.manual_seed(1234 + ctx.rank)  # different data on every rank
    big = max(sizes)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=4 * big + (64 << 20), timeout_s=60))
    ar = AllReduce(comm, max_bytes=big, algos=("twoshot",))
    hout = comm.empty(big // 2, torch.bfloat16)

    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
        out = torch.empty_like(x)
        sym = hout[: x.numel()]
        nb = x.clone()
        forms = {"push": (False, out), "pull": (True, out), "sym_out": (False, sym)}
        bits = {}
        for name, (pull, o) in forms.items():
            ar._pull_override = pull
            o.fill_(float("nan"))
            bits[name] = ar(x, o).clone()
        ref = x.float()
        dist.all_reduce(ref, group=ctx.group)
        err = ((bits["pull"].float() - ref).abs().max() / ref.abs().max()).item()
        same = all(torch.equal(bits["push"], b) for b in bits.values())
        samples: dict[str, list[float]] = {}
        for _ in range(reps):
            for name, (pull, o) in forms.items():
                ar._pull_override = pull
                samples.setdefault(name, []).append(
                    time_per_call_us(lambda o=o, x=x: ar(x, o), ctx.device, ctx.barrier, replays=10))
            samples.setdefault("nccl", []).append(
                time_per_call_us(lambda: dist.all_reduce(nb, group=ctx.group), ctx.device, ctx.barrier, replays=10))  # noqa: B023
        t = _max_over_ranks(ctx, {k: sorted(v)[len(v) // 2] for k, v in samples.items()})
        rows.append({"bytes": nbytes, "same_bits": same, "pull_rel_err": err, **t})
        if ctx.rank == 0:
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    comm.free(hout)
    ar.close()
    comm.close()
    return {"world": ctx.world, "rows": rows} if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="1M,2M,3000000,4M,8M,16M,32M,64M,128M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rep = launch(pull_rank, a.world, sizes, a.reps, timeout=560)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
