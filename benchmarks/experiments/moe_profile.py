"""Where MoE dispatch/combine time goes: each kernel's GPU time (torch profiler), eager, one shape.

    python3 benchmarks/experiments/moe_profile.py --world 1 --tokens 8,4096 [--mode throughput]
        [--max-tokens 4096] [--block-e 4096] [--programs-per-sm 2] [--num-warps 8] [--block-h 2048] [--fp8]

``--max-tokens`` sizes the instance for more tokens than each call carries (decode calls on an
instance sized for prefill).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import default_shape
from tritoncomm.config import CommConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity


def _step(moe: MoEAllToAll, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> None:
    _, _, h = moe.dispatch(x, ids, w)
    moe.combine(moe.expert_buffer(), h)


def _rank(ctx, shape: str, tokens: list[int], mode: str, max_tokens: int | None, overrides: dict[str, int],
          fp8: bool = False):
    hidden, experts, k = MOE_SHAPES[shape]
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=4 << 30))
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    per_sm = overrides.pop("programs_per_sm", None)
    out = {}
    for t in tokens:
        m = max(max_tokens or t, t)
        launch = replace(default_shape("cuda", m, sms), **overrides)
        if per_sm:
            launch = replace(launch, programs=sms * per_sm)
        moe = MoEAllToAll(comm, max_tokens=m, hidden=hidden, num_experts=experts, top_k=k,
                          capacity=bench_capacity(ctx.world, m, experts, k), mode=mode, shape=launch, fp8_dispatch=fp8)
        x = torch.randn(t, hidden, device=ctx.device).to(torch.bfloat16)
        ids = torch.rand(t, experts, device=ctx.device).topk(k).indices
        w = torch.rand(t, k, device=ctx.device)

        for _ in range(3):
            _step(moe, x, ids, w)
        torch.cuda.synchronize()
        ctx.barrier()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                _step(moe, x, ids, w)
            torch.cuda.synchronize()
        per = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name[:40]] += ev.device_time / 10
        out[t] = dict(per)
        moe.close()
    comm.close()
    return out if ctx.rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--shape", default="deepseek-v3")
    p.add_argument("--tokens", default="8,4096")
    p.add_argument("--mode", default="auto", choices=("auto", "latency", "throughput"))
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--block-e", type=int, default=None, help="routing entries per histogram block")
    p.add_argument("--programs-per-sm", type=int, default=None, help="send, gather and combine programs per SM")
    p.add_argument("--num-warps", type=int, default=None)
    p.add_argument("--block-h", type=int, default=None, help="columns per step")
    p.add_argument("--fp8", action="store_true", help="FP8 dispatch")
    a = p.parse_args()
    overrides = {k: v for k, v in (("block_e", a.block_e), ("programs_per_sm", a.programs_per_sm),
                                   ("num_warps", a.num_warps), ("block_h", a.block_h)) if v}
    with LocalWorld(a.world, "cuda") as world:
        rep = world.run(_rank, a.shape, [int(t) for t in a.tokens.split(",")], a.mode, a.max_tokens, overrides,
                        a.fp8, timeout=600)[0]
    for t, per in rep.items():
        print(f"{a.shape} EP{a.world} {t} tokens/rank (max_tokens {a.max_tokens or t}, mode {a.mode}, fp8 {a.fp8}, "
              f"launch {overrides or 'default'}): GPU us per dispatch+combine, by kernel")
        for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"  {us:9.1f}  {name}")


if __name__ == "__main__":
    main()
