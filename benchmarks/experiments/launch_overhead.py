"""Experiment: how much host time does an eager collective call spend launching its kernel, and how
much does ``kernels.Launcher`` save? Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/launch_overhead.py --world 2 --json out.json

Host microseconds per call (the best of 5 loops of ``--calls`` calls, timed before the GPU is waited
for; 8 KB bf16) on each rank, in three modes interleaved: every launcher on its short path calling
Triton's C entry point (``direct``), the short path through Triton's Python wrapper of it
(``Launcher.direct = False``: ``short``), and forced through ``kernel[grid]`` (``Launcher.fast =
False``, what every launch did before ``Launcher``: ``triton``):

* ``torch.add`` into a preallocated output: one kernel launched from Python, for scale;
* ``AllReduce`` called directly, and with its launch replaced by a no-op (our Python alone);
* ``dist.all_reduce`` on a ``tritoncomm`` backend group, and on the NCCL group (world > 1);
* MoE dispatch + combine (8 tokens, Qwen3-MoE's shape), eager.

Before timing, every all-reduce algorithm set up runs through the short path on odd sizes and three
dtypes and is compared bit for bit with the rank-order fp32 sum of the gathered inputs. Then the
short path's parts one by one (``anatomy``), and rank 0's cProfile of the direct call.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from hosttime import host_us, main_for, profile_text  # benchmarks/experiments/, the script's directory

import tritoncomm as tc
from tritoncomm.integrations.backend import register


def _anatomy(ctx, ar: tc.AllReduce, x: torch.Tensor, out: torch.Tensor, n: int) -> dict[str, float]:
    """The short path's parts for the algorithm ``ar`` picks for ``x``, timed one by one."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import native_specialize_impl as spec

    algo = ar.algorithm(ar.select(x.numel() * x.element_size(), x.dtype))
    ln, seen = algo.launcher, []
    algo.launcher = lambda *a, **kw: seen.append((a, kw))
    ar(x, out)
    algo.launcher = ln
    args, kw = seen[0]
    ln(*args, **kw)
    ln(*args, **kw)
    kernel, tail, entry = next(iter(ln._cache.values()))
    be, dev = ln._backend, driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    g = ln._dims
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    return {
        f"anatomy ({algo.name}): Launcher call, short path": host_us(lambda: ln(*args, **kw), n, ctx.device),
        "anatomy: signature key": host_us(
            lambda: (dev, *kw.items(), *[spec(be, a, False, True, True) for a in args]), n, ctx.device),
        "anatomy: device + stream queries": host_us(
            lambda: driver.active.get_current_stream(driver.active.get_current_device()), n, ctx.device),
        "anatomy: compiled kernel's run": host_us(
            lambda: kernel.run(*g, stream, kernel.function, kernel.packed_metadata, None, None, None, *args, *tail),
            n, ctx.device),
        **({} if entry is None else {
            "anatomy: C entry point": host_us(
                lambda: entry[0](*g, stream, kernel.function, entry[1], entry[2], None, None, kernel.packed_metadata,
                                 None, None, None, *args, *tail), n, ctx.device),
            "anatomy: C entry point, pointers as ints": host_us(
                lambda: entry[0](*g, stream, kernel.function, entry[1], entry[2], None, None, kernel.packed_metadata,
                                 None, None, None, *ints, *tail), n, ctx.device)}),
        "anatomy: Triton kernel[grid]": host_us(lambda: algo.kernel[ln.grid](*args, **kw), n, ctx.device),
        "anatomy: comm.kernel_args + pow2_divisor": host_us(lambda: (ar.comm.kernel_args(), x.numel() & -x.numel()),
                                                             n, ctx.device),
    }


def _launchers(*objs) -> list:
    out = []
    for o in objs:
        for a in map(o.algorithm, getattr(o, "algorithms", ())):
            if a.launcher is not None:
                out.append(a.launcher)
        out += [v for k, v in vars(o).items() if k.startswith("_run_")]
    return out


def _check(ctx, ar: tc.AllReduce) -> dict:
    """Bits of every algorithm against the rank-order fp32 sum, through the short path."""
    gen = torch.Generator(device=ctx.device).manual_seed(1234 + ctx.rank)
    res = {}
    for algo in ar.algorithms:
        bad = 0
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for n in (1, 7, 1000, 4097, 65537):
                if n * dtype.itemsize > ar.algorithm(algo).capacity:
                    continue
                for _ in range(2):
                    x = torch.randn(n, generator=gen, device=ctx.device).to(dtype)
                    out = torch.full_like(x, float("nan"))
                    ar(x, out, algo=algo)
                    parts = [torch.empty_like(x) for _ in range(ctx.world)]
                    dist.all_gather(parts, x, group=ctx.group)
                    want = sum((p.float() + 0.0 for p in parts[1:]), parts[0].float() + 0.0).to(dtype)
                    bad += int(not torch.equal(out, want))
        res[algo] = bad
    return res


def overhead_rank(ctx, n: int) -> dict:
    comm = tc.Communicator(ctx.cpu_group, config=tc.CommConfig(heap_bytes=256 << 20))
    ar = tc.AllReduce(comm)
    moe = tc.MoEAllToAll(comm, max_tokens=8, hidden=4096, num_experts=128, top_k=8)
    register()
    g = dist.new_group(backend="tritoncomm")
    check = _check(ctx, ar)
    x = torch.randn(4096, device=ctx.device).to(torch.bfloat16)
    out, y = torch.empty_like(x), torch.empty_like(x)
    tok = torch.randn(8, 4096, device=ctx.device).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(128, device=ctx.device)[:8] for _ in range(8)]).int()
    wts = torch.rand(8, 8, device=ctx.device)

    def moe_step():
        _, _, h = moe.dispatch(tok, ids, wts)
        moe.combine(moe.expert_buffer(), h)

    rows: dict[str, float] = {}
    launchers = _launchers(ar, moe)
    fast = [ln.fast for ln in launchers]
    cases = {"torch.add": lambda: torch.add(x, x, out=y), "AllReduce direct": lambda: ar(x, out),
             "dist.all_reduce (tritoncomm group)": lambda: dist.all_reduce(x, group=g),
             "MoE dispatch+combine (8 tokens)": moe_step}
    for _ in range(3):  # the modes interleaved, the best of three rounds each: the host's speed drifts
        for mode in ("direct", "short", "triton"):
            for ln, f in zip(launchers, fast, strict=True):
                ln.fast, ln.direct = f and mode != "triton", mode == "direct"
            for name, fn in cases.items():
                ctx.barrier()
                t = host_us(fn, n, ctx.device)
                rows[f"{mode}: {name}"] = min(t, rows.get(f"{mode}: {name}", t))
    for ln, f in zip(launchers, fast, strict=True):
        ln.fast, ln.direct = f, True
    for a in map(ar.algorithm, ar.algorithms):  # our Python alone: the launch replaced by a no-op
        a.launcher, a._saved = (lambda *args, **kw: None), a.launcher
    ctx.barrier()
    rows["no launch: AllReduce direct"] = host_us(lambda: ar(x, out), n, ctx.device)
    for a in map(ar.algorithm, ar.algorithms):
        a.launcher = a._saved
    rows.update(_anatomy(ctx, ar, x, out, n))
    if ctx.world > 1:
        ctx.barrier()
        rows["NCCL dist.all_reduce"] = host_us(lambda: dist.all_reduce(x, group=ctx.group), n, ctx.device)
    prof = profile_text(lambda: ar(x, out), n, 15) if ctx.rank == 0 else None
    torch.cuda.synchronize(ctx.device)
    dist.destroy_process_group(g)
    moe.close()
    ar.close()
    comm.close()
    return {"rank": ctx.rank, "world": ctx.world, "check_mismatches": check, "host_us_per_call": rows,
            "profile_rank0": prof, "device": torch.cuda.get_device_name(ctx.device),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}


if __name__ == "__main__":
    main_for(overhead_rank, 500)
