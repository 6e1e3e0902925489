"""Where the MoE dispatch and the combine spend their time: stage stamps inside the kernels.

    python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 1,8,128 [--shape deepseek-v3] [--fp8]
        [--send-programs N] [--push-programs N] [--max-tokens M] [--one-kernel-entries N] [--heap-gb G]
        [--set FIELD=V,...] [--json out.json]

Per token count: an instance sized for that many tokens per rank (its default launch shape), stage
stamps on (``MoEAllToAll.trace_stages``), dispatch + combine timed in a CUDA graph of 16 calls
(``tools.timing``); the stamps read afterwards are those of the last call of the last replay, whose
dispatch followed a combine as in a decode loop. Each stage is given in µs since the earliest start
of a dispatch program on that rank (the global timer, one clock for all SMs), as the earliest,
median and latest program; the traced kernels are other builds than the default ones, and the
per-call time printed beside them is theirs. In the CPU world (``--backend cpu``) the stamps are 0:
a check that the script runs, not a measurement. Calls dispatched in one kernel (up to the shape's
``one_kernel_entries`` routing entries; ``--one-kernel-entries`` sets it) or by the route and send
kernels (larger instances: ``route.ROUTED_STAGES``, the route kernel's stages, then the send
kernel's) are traced; the send and gather kernels (instances of at most ``route_above`` entries) are
not.
With ``--max-tokens`` the instance is sized for ``M`` tokens and every call passes ``tokens_bound``
(the engine path: below ``prefill_from`` tokens the calls launch with the decode shape, and only
the programs launched are summarised). With ``--send-programs`` / ``--push-programs``
(``MoEShape.send_programs``, ``push_programs``) each kernel's stages are given per group of programs:
those that send (push) and those that lay out (sum). ``--set`` changes int fields of the instance's
``MoEShape`` (``super_blocks=8,layout_block_h=4096``; bools as 0 or 1).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import default_shape
from tritoncomm.config import CommConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity
from tritoncomm.tools.timing import time_per_call_us

DISPATCH = ("started", "copies sent", "rows sent", "copy read", "laid out", "done")
ROUTED = ("route: started", "route: tables sent", "route: barrier passed", "send: started", "send: rows sent",
          "send: barrier passed", "send: laid out", "first item: started", "first item: slots stored",
          "first item: block 0 stored", "first item: stores issued")
COMBINE = ("started", "mode known", "pushed", "done")


def _rank(ctx, shape: str, tokens: list[int], fp8: bool, senders: int, pushers: int, max_tokens: int | None = None,
          one_kernel_entries: int = 0, heap_gb: float = 1.0, direct_from_bytes: int | None = None,
          sets: dict[str, int] | None = None) -> dict:
    hidden, experts, k = MOE_SHAPES[shape]
    heap = int(heap_gb * (1 << 30)) if ctx.backend == "cuda" else 64 << 20
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap))
    out = {}
    for t in tokens:
        gen = torch.Generator(device=ctx.device).manual_seed(1000 * t + ctx.rank)
        x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
        w = torch.rand(t, k, device=ctx.device, generator=gen)
        sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.device.type == "cuda" else 1
        m = max(max_tokens or t, t)
        gpu = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else ""
        sh = replace(default_shape(ctx.backend, m, sms, hidden=hidden, wire_bytes=1 if fp8 else 2, world=ctx.world,
                                   device_name=gpu), send_programs=senders, push_programs=pushers)
        if one_kernel_entries:
            sh = replace(sh, one_kernel_entries=one_kernel_entries)
        if direct_from_bytes is not None:
            sh = replace(sh, direct_from_bytes=direct_from_bytes)
        sh = replace(sh, **(sets or {}))
        bound = {"tokens_bound": t} if m > t else {}
        # the default decode shape for bounded calls, with the requested split (a shape given turns
        # the default off)
        small = replace(default_shape(ctx.backend, 1, sms, world=ctx.world), send_programs=senders,
                        push_programs=pushers)
        decode = {"decode_shape": small} if bound and small.programs <= sh.programs and small != sh else {}
        moe = MoEAllToAll(comm, max_tokens=m, hidden=hidden, num_experts=experts, top_k=k,
                          capacity=bench_capacity(ctx.world, m, experts, k), fp8_dispatch=fp8, shape=sh, **decode)
        dispatch_trace, combine_trace, routed_trace = moe.trace_stages()
        path, launched = moe.dispatch_path(t if bound else None)

        def step(moe: MoEAllToAll = moe, x: torch.Tensor = x, ids: torch.Tensor = ids, w: torch.Tensor = w,
                 bound: dict = bound) -> None:
            _, _, h = moe.dispatch(x, ids, w, **bound)
            moe.combine(moe.expert_buffer(), h)

        us = time_per_call_us(step, ctx.device, ctx.barrier, calls=16, replays=5)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        d, c, r = dispatch_trace[0].cpu(), combine_trace[0].cpu(), routed_trace[0].cpu()  # one row: every call's
        routed = path.startswith("routed")
        if routed:
            d = r
        d, c = d[:launched.programs], c[:launched.programs]  # the programs this launch has
        t0 = int(d[:, 0, 0].min())
        out[str(t)] = {"us_per_call": us, "programs": d.shape[0], "routed": routed, "path": path,
                       "senders": 0 if routed else launched.senders(ctx.world), "pushers": launched.pushers(t, hidden),
                       "max_tokens": m,
                       "dispatch_ns": _since(d[:, :, 0], t0), "combine_ns": _since(c[:, :, 0], t0),
                       "dispatch_cycles": d[:, :, 1].tolist(), "combine_cycles": c[:, :, 1].tolist()}
        moe.close()
    comm.close()
    return out


def _groups(split: int, programs: int) -> list[tuple[str, slice]]:
    """The groups of programs whose stages are summarised apart: all, or those below ``split`` and
    the rest."""
    if split == 0:
        return [("", slice(0, programs))]
    return [(f" [0,{split})", slice(0, split)), (f" [{split},{programs})", slice(split, programs))]


def _since(stamps: torch.Tensor, t0: int) -> list:
    """ns since ``t0``; NaN for a stage a program did not stamp (0: the routed first-item stages of a
    program without such an item)."""
    return torch.where(stamps != 0, (stamps - t0).double(), float("nan")).tolist()


def _row(name: str, ns: torch.Tensor) -> str:
    ns = ns.double()
    if bool(ns.isnan().all()):
        return f"    {name:<34}{'-':>9}{'-':>9}{'-':>9}"
    q = torch.nanquantile(ns / 1e3, torch.tensor([0.0, 0.5, 1.0], dtype=torch.double))
    return f"    {name:<34}{q[0]:9.2f}{q[1]:9.2f}{q[2]:9.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--shape", default="deepseek-v3", choices=sorted(MOE_SHAPES))
    p.add_argument("--tokens", default="1,8,128")
    p.add_argument("--fp8", action="store_true", help="FP8 dispatch")
    p.add_argument("--send-programs", type=int, default=-1,
                   help="MoEShape.send_programs (0: every program; -1: the default split)")
    p.add_argument("--push-programs", type=int, default=-1,
                   help="MoEShape.push_programs (0: every program; -1: the default split)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="size the instance for this many tokens; calls then pass tokens_bound")
    p.add_argument("--one-kernel-entries", type=int, default=0, help="MoEShape.one_kernel_entries (0: the shape's)")
    p.add_argument("--heap-gb", type=float, default=1.0, help="symmetric heap per rank (GiB; 8 for 4096 tokens)")
    p.add_argument("--direct-from-bytes", type=int, default=None,
                   help="MoEShape.direct_from_bytes (default: the shape's)")
    p.add_argument("--set", default="", help="FIELD=VALUE,... int fields of MoEShape for the instance")
    p.add_argument("--json", default=None, help="write every program's stamps here")
    a = p.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    sets = {n: int(v) for n, v in (c.split("=") for c in a.set.split(",") if c)}
    with LocalWorld(a.world, a.backend) as world:
        reps = world.run(_rank, a.shape, tokens, a.fp8, a.send_programs, a.push_programs, a.max_tokens,
                         a.one_kernel_entries, a.heap_gb, a.direct_from_bytes, sets, timeout=600)
    dev = torch.cuda.get_device_name(0) if a.backend == "cuda" else "CPU world (stamps are 0)"
    changed = f", {a.set}" if a.set else ""
    print(f"{a.shape} EP{a.world} on {dev}, fp8 {a.fp8}{changed}: stage stamps of the last call of a graph of 16, "
          f"µs since the rank's first dispatch program started (earliest / median / latest program)")
    for t in tokens:
        for r, rep in enumerate(reps):
            one = rep[str(t)]
            print(f"{t} tokens/rank (instance of {one['max_tokens']}), rank {r}: {one['us_per_call']:.2f} µs per "
                  f"traced call, {one['programs']} programs, {one['path']}")
            for kernel, names, key, split in (("dispatch", ROUTED if one["routed"] else DISPATCH, "dispatch_ns",
                                               one["senders"]),
                                              ("combine", COMBINE, "combine_ns", one["pushers"])):
                ns = torch.tensor(one[key])
                for label, part in _groups(split, one["programs"]):
                    for i, name in enumerate(names):
                        print(_row(f"{kernel}{label} {name}", ns[part, i]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": a.shape, "world": a.world, "device": dev, "fp8": a.fp8, "max_tokens": a.max_tokens,
                       "one_kernel_entries": a.one_kernel_entries, "direct_from_bytes": a.direct_from_bytes,
                       "send_programs": a.send_programs, "push_programs": a.push_programs, "set": sets,
                       "ranks": reps}, f)


if __name__ == "__main__":
    main()
