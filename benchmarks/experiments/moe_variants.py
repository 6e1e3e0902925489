"""Which launch variant of MoE dispatch + combine is fastest end to end, in CUDA graphs?

    python3 benchmarks/experiments/moe_variants.py --world 1 --tokens 1,8,128,4096 \
        --variants default,no-pdl,no-regcap [--rounds 3] [--max-tokens 4096] [--fp8] [--op dispatch] \
        [--json out.json]

A variant is ``default`` (the launch shape an instance given none takes on this GPU: ``default_shape``
with the device's name) or ``+``-joined changes to it: ``no-pdl`` and
``pdl`` (``MoEShape.pdl``: programmatic dependent launch off or on), ``one-kernel`` and
``two-kernel`` (``MoEShape.one_kernel``: the dispatch in one kernel where the instance allows it, or
the send and gather kernels), ``no-regcap`` (no register cap keeping every program resident),
``FIELD=VALUE`` (an int or bool field of ``MoEShape`` as an int, e.g. ``send_block_h=2048``,
``packets=0``), ``bound`` (each call
passes ``tokens_bound``, its token count: one kernel on instances sized for more; below
``PREFILL_FROM`` tokens with the decode shape, as by default), ``no-decode`` (such calls keep the
instance's shape), ``decode_below=N`` (the constructor's switch for them), ``mode=latency`` or
``mode=throughput`` and ``throughput_from=N`` (the constructor's combine mode and switch); a field change other
than the grid's (programs, columns, warps, roles) applies to the decode shape too;
``docs/moe.md`` names the
checkout of its route-kernel variants. Each round times every variant in turn on the same inputs
(``tools.timing.time_per_call_us``, graph mode), so drift between variants is spread over the
rounds; the median over rounds is printed. Changes the tree does not know (an older checkout) are
reported as such, not timed. ``--op dispatch`` times dispatches alone (as ``bench --op moe``'s
dispatch rows do), ``both`` (the default) a dispatch and a combine per call. The JSON keeps every
sample of every round (``samples_us``): whether a slow round was slow throughout. ``--heap-gb`` sizes
the heap (every variant's instance lives in it at once: four at 4096 tokens of DeepSeek-V3 at EP4
need more than 4 GB).
Kernel-by-kernel profiles cannot show PDL's gain (a PDL kernel's span
includes its wait for the previous one): this times whole calls.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
from dataclasses import fields, replace

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import PREFILL_FROM, MoEShape, default_shape
from tritoncomm.config import CommConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity
from tritoncomm.tools.timing import time_per_call_us


def _build(comm: Communicator, variant: str, m: int, hidden: int, experts: int, k: int, world: int,
           sms: int, fp8: bool) -> MoEAllToAll | None:
    changes = set() if variant == "default" else set(variant.split("+"))
    # the library's default on this GPU (older trees' default_shape takes no world or device name)
    params = inspect.signature(default_shape).parameters
    by_world = {"world": world} if "world" in params else {}
    by_gpu = {"device_name": torch.cuda.get_device_name(comm.device)} if "device_name" in params else {}
    shape = default_shape("cuda", m, sms, hidden=hidden, wire_bytes=1 if fp8 else 2, **by_world, **by_gpu)
    known = {f.name for f in fields(MoEShape)}
    if changes & {"no-pdl", "pdl"}:
        if "pdl" not in known:
            return None
        shape = replace(shape, pdl="pdl" in changes)
    if changes & {"one-kernel", "two-kernel"}:
        if "one_kernel" not in known:
            return None
        shape = replace(shape, one_kernel="one-kernel" in changes)
    if "bound" in changes and "tokens_bound" not in inspect.signature(MoEAllToAll.dispatch).parameters:
        return None
    # FIELD=VALUE changes of the shape (decode_below is a constructor argument, not a shape field)
    ctor_args = ("decode_below", "mode", "throughput_from")
    set_fields = {n: int(v) for n, v in (c.split("=") for c in changes if "=" in c) if n not in ctor_args}
    if not set_fields.keys() <= known:
        return None
    shape = replace(shape, **set_fields)
    extra = {}
    ctor = inspect.signature(MoEAllToAll).parameters
    # bounded calls on large instances take the decode shape, as with the library's default shape
    # (a shape given turns that off unless decode_shape is given too), with the variant's field
    # changes other than the launch grid's; "no-decode": the instance's shape
    if "decode_shape" in ctor and m >= PREFILL_FROM \
            and shape.one_kernel and shape.programs >= sms and "no-decode" not in changes:
        grid = {"programs", "block_h", "num_warps", "send_block_h", "one_block_h", "send_programs", "push_programs"}
        extra["decode_shape"] = replace(default_shape("cuda", 1, sms, **by_world),
                                        **{"packets": shape.packets, **{n: v for n, v in set_fields.items()
                                                                        if n not in grid}})
    elif "no-decode" in changes and "decode_shape" not in ctor:
        return None
    for change in (c for c in changes if c.startswith("decode_below=")):
        if "decode_below" not in ctor:
            return None
        extra["decode_below"] = int(change.split("=")[1])
    for change in (c for c in changes if c.startswith(("mode=", "throughput_from="))):
        name, value = change.split("=")
        if name not in ctor:
            return None
        extra[name] = value if name == "mode" else int(value)
    moe = MoEAllToAll(comm, max_tokens=m, hidden=hidden, num_experts=experts, top_k=k,
                      capacity=bench_capacity(world, m, experts, k), shape=shape, fp8_dispatch=fp8, **extra)
    if "no-regcap" in changes:
        moe.algorithms["one-kernel"].opts.pop("maxnreg", None)  # shared by every launch; before the first
    return moe


def _rank(ctx, shape: str, tokens: list[int], variants: list[str], rounds: int, max_tokens: int | None,
          fp8: bool, op: str = "both", heap_gb: float = 4.0):
    hidden, experts, k = MOE_SHAPES[shape]
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=int(heap_gb * (1 << 30))))
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    out: dict[str, dict[str, list[float]]] = {}
    every: dict[str, dict[str, list[list[float]]]] = {}  # every sample of every round
    for t in tokens:
        gen = torch.Generator(device=ctx.device).manual_seed(1000 * t + ctx.rank)
        x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
        w = torch.rand(t, k, device=ctx.device, generator=gen)
        m = max(max_tokens or t, t)
        moes = {v: _build(comm, v, m, hidden, experts, k, ctx.world, sms, fp8) for v in variants}
        times: dict[str, list[float]] = {v: [] for v in variants}
        every[str(t)] = {v: [] for v in variants}
        for _ in range(rounds):
            for v, moe in moes.items():
                if moe is None:
                    continue

                bound = {"tokens_bound": t} if "bound" in v.split("+") else {}

                def both(moe: MoEAllToAll = moe, x: torch.Tensor = x, ids: torch.Tensor = ids,
                         w: torch.Tensor = w, bound: dict = bound) -> None:
                    _, _, h = moe.dispatch(x, ids, w, **bound)
                    if op == "both":
                        moe.combine(moe.expert_buffer(), h)

                taken: list[float] = []
                times[v].append(time_per_call_us(both, ctx.device, ctx.barrier, mode="graph", samples_out=taken))
                every[str(t)][v].append(taken)
        for moe in moes.values():
            if moe is not None:
                moe.close()
        out[str(t)] = times
    comm.close()
    return {"times_us": out, "samples_us": every} if ctx.rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--shape", default="deepseek-v3", choices=sorted(MOE_SHAPES))
    p.add_argument("--tokens", default="1,8,128,4096")
    p.add_argument("--variants", default="default,no-pdl")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=None, help="size the instances for this many tokens per rank")
    p.add_argument("--json", default=None, help="write the raw times here")
    p.add_argument("--fp8", action="store_true", help="FP8 dispatch")
    p.add_argument("--op", default="both", choices=["both", "dispatch"], help="what one timed call does")
    p.add_argument("--heap-gb", type=float, default=4.0, help="symmetric heap per rank (GiB)")
    a = p.parse_args()
    variants = a.variants.split(",")
    with LocalWorld(a.world, "cuda") as world:
        rep = world.run(_rank, a.shape, [int(t) for t in a.tokens.split(",")], variants, a.rounds, a.max_tokens,
                        a.fp8, a.op, a.heap_gb, timeout=600)[0]
    dev = torch.cuda.get_device_name(0)
    print(f"{a.shape} EP{a.world} on {dev}, graphs, max_tokens {a.max_tokens or 'tokens'}, fp8 {a.fp8}: us per "
          f"{'dispatch + combine' if a.op == 'both' else 'dispatch'}, median of {a.rounds} rounds (every round: "
          f"the JSON)")
    print("tokens  " + "".join(f"{v:>24}" for v in variants))
    for t, times in rep["times_us"].items():
        cells = [f"{statistics.median(times[v]):24.2f}" if times[v] else f"{'not in this tree':>24}" for v in variants]
        print(f"{t:>6}  " + "".join(cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": a.shape, "world": a.world, "device": dev, "max_tokens": a.max_tokens, "fp8": a.fp8,
                       "op": a.op, **rep}, f, indent=1)


if __name__ == "__main__":
    main()
