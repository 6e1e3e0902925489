"""Does MoE dispatch + combine complete on instances of a few tokens called full? One fresh world
of two ranks per configuration (``LocalWorld(2, "cuda", shared_gpus=True)``: correctness only),
each a comma-separated ``tokens,shape,mode,pdl,max_tokens,packets``: ``tokens`` per call and rank,
``shape`` ``decode`` / ``prefill`` (``default_shape`` below / from ``PREFILL_FROM``) or
``throughput`` (the decode shape, throughput combine), ``mode`` ``graph`` / ``eager`` timing
(``time_per_call_us``, as ``tune --op moe`` runs it: ``combine`` given ``expert_buffer()``),
``pdl`` and ``packets`` 0/1. Prints ok with the time, or the timeout each rank raised.

    PYTHONPATH=. python3 benchmarks/experiments/moe_small_instances.py 1,decode,eager,1,1,1 1,decode,eager,0,1,1
"""

import sys
import time
from dataclasses import replace

import torch

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import default_shape
from tritoncomm.config import CommConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity
from tritoncomm.tools.timing import time_per_call_us

NEVER = 1 << 31

def job(ctx, t, label, mode, pdl, m, packets):
    hidden, experts, k = MOE_SHAPES["tiny"]
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=1 << 30, timeout_s=10))
    gen = torch.Generator(device=ctx.device).manual_seed(7919 * t + ctx.rank)
    x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
    ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
    w = torch.rand(t, k, device=ctx.device, generator=gen)
    common = dict(max_tokens=m, hidden=hidden, num_experts=experts, top_k=k,
                  capacity=bench_capacity(ctx.world, m, experts, k))
    sh = default_shape("cuda", 1 if label != "prefill" else NEVER, sms, hidden=hidden)
    sh = replace(sh, pdl=pdl, packets=packets)
    moe = MoEAllToAll(comm, **common, mode="throughput" if label == "throughput" else "latency", shape=sh)
    def step():
        _, _, h = moe.dispatch(x, ids, w)
        moe.combine(moe.expert_buffer(), h)
    t0 = time.time()
    try:
        us = time_per_call_us(step, ctx.device, ctx.barrier, mode=mode)
        comm.check()
        res = f"ok {us:.1f} us"
    except Exception as e:
        res = "FAIL " + str(e)[:300]
    try:
        moe.close()
        comm.close()
    except Exception as e:
        res += " | close: " + str(e)[:80]
    return f"{res} ({time.time()-t0:.0f}s) shape={sh.programs}x{sh.num_warps}w one={sh.one_kernel} pdl={sh.pdl}"

def main():
    for a in sys.argv[1:]:
        f = a.split(",")
        t, label, mode, pdl, m, packets = int(f[0]), f[1], f[2], f[3] == "1", int(f[4]), f[5] == "1"
        w = LocalWorld(2, "cuda", shared_gpus=True, setup_timeout=120)
        try:
            out = w.run(job, t, label, mode, pdl, m, packets, timeout=120)
            print(a, "|", " || ".join(out), flush=True)
        except Exception as e:
            print(a, "RANKERROR", str(e)[-400:], flush=True)
        finally:
            w.close()

if __name__ == "__main__":
    main()
