"""``bench --op deterministic``: what the engines' deterministic modes run, timed side by side.

vLLM's batch-invariant mode and SGLang's deterministic inference keep (vLLM: ask at every size) their
custom all-reduce slot, which tritoncomm serves with the same kernels as in the normal mode (every
algorithm sums in fp32 over ranks 0..W-1 in that order), and turn the fused all-reduce + add + RMSNorm
off: the layer then runs the all-reduce, the residual add and the RMSNorm one after another. Per
size and token count, in CUDA graphs (CPU world: eagerly, not speed), the slowest rank's median:

* all-reduce: tritoncomm (the table's pick, what either mode's slot runs) and NCCL;
* add + RMSNorm after the all-reduce (``hidden``, bf16): tritoncomm's fused op as the normal mode
  runs it and with batch-invariant rows (``batch_invariant=True``, the engines' rounding: what the
  plugins serve in these modes); the unfused path with tritoncomm's all-reduce and with NCCL's
  (``all-reduce, then add, then F.rms_norm``: three or more kernels); and the engines' own
  deterministic path, two kernels: the all-reduce, then one add + RMSNorm kernel of one program per
  row (vLLM's batch-invariant mode calls its ``fused_add_rms_norm``), here
  ``fused_norm.local.invariant_add_rms_norm`` standing in for the engine's compiled one, after
  tritoncomm's all-reduce and (GPUs, where ``../shared/peers`` is installed) after vLLM's custom
  all-reduce (FlashInfer's port, ``tools.peers``): what vLLM runs in that mode without tritoncomm.

Every row is checked first: tritoncomm's all-reduce against NCCL's, the fused op against the unfused
path (tolerance), the engine path's output against the batch-invariant op's bits, vLLM's custom
all-reduce against tritoncomm's (the same bits at two ranks, where the order of two addends cannot
matter; tolerance at more), and each result the same on every rank.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..channels import Communicator
from ..collectives import AllReduce, FusedAllReduceAddRMSNorm
from ..collectives.fused_norm import invariant_add_rms_norm
from ..config import CommConfig
from ..launch import RankContext
from ..units import format_bytes
from .peers import VllmCustomAllReduce
from .report import all_true, fmt, max_over_ranks, same_on_all_ranks
from .timing import time_per_call_us

__all__ = ["deterministic_rank", "format_deterministic"]

#: backend: (all-reduce sizes in bytes, token counts, hidden)
DEFAULTS = {"cuda": ([8 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20], [1, 8, 32, 128, 512, 2048], 8192),
            "cpu": ([1 << 10, 8 << 10], [1, 4], 64)}


def deterministic_rank(ctx: RankContext, sizes: list[int] | None = None,
                       tokens: list[int] | None = None) -> dict[str, Any] | None:
    """Every rank runs it; rank 0 returns the report (module docstring)."""
    d_sizes, d_tokens, hidden = DEFAULTS[ctx.backend]
    sizes, tokens = sizes or d_sizes, tokens or d_tokens
    mode = "graph" if ctx.backend == "cuda" else "eager"
    most = max(max(sizes), max(tokens) * hidden * 2)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=10 * most + (64 << 20)))  # two fused ops
    ar = AllReduce(comm, max_bytes=most)
    norm = FusedAllReduceAddRMSNorm(comm, max_tokens=max(tokens), max_hidden=hidden)
    inv = FusedAllReduceAddRMSNorm(comm, max_tokens=max(tokens), max_hidden=hidden, rounding="engine",
                                   batch_invariant=True, name="bench.invariant")
    dev = ctx.device
    vca = VllmCustomAllReduce(ctx, max(tokens) * hidden * 2) if ctx.backend == "cuda" else None

    def timed(fn, after_capture=None) -> float:
        return time_per_call_us(fn, dev, ctx.barrier, mode=mode, after_capture=after_capture)

    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=dev, generator=torch.Generator(device=dev).manual_seed(nbytes + ctx.rank))
        x = x.to(torch.bfloat16)
        out, ref = torch.empty_like(x), x.clone()
        ar(x, out=out)
        dist.all_reduce(ref, group=ctx.group)
        ok = bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)) and same_on_all_ranks(ctx, out)
        nccl_buf = x.clone()
        v = max_over_ranks(ctx, {"t": timed(lambda x=x, out=out: ar(x, out=out)),
                                 "n": timed(lambda b=nccl_buf: dist.all_reduce(b, group=ctx.group))})
        rows.append({"bytes": nbytes, "algo": ar.select(nbytes), "tritoncomm_us": v["t"], "nccl_us": v["n"],
                     "correct": all_true(ctx, ok)})
    w = (torch.rand(hidden, device=dev, generator=torch.Generator(device=dev).manual_seed(1)) + 0.5).to(torch.bfloat16)
    norm_rows = []
    for t in tokens:
        g = torch.Generator(device=dev).manual_seed(t + 17 * ctx.rank)
        x = torch.randn(t, hidden, device=dev, generator=g).to(torch.bfloat16)
        res0 = torch.randn(t, hidden, device=dev, generator=torch.Generator(device=dev).manual_seed(t)).to(
            torch.bfloat16)
        res, out, summed = res0.clone(), torch.empty_like(x), torch.empty_like(x)
        y = norm(x, res, w, out=out).clone()
        y_i = inv(x, res0.clone(), w).clone()
        res_u = res0.clone()
        ar(x, out=summed)
        res_u.add_(summed)
        y_u = F.rms_norm(res_u, (hidden,), w, 1e-6)
        ok = all(bool(torch.allclose(a.float(), y_u.float(), rtol=3e-2, atol=3e-2)) and same_on_all_ranks(ctx, a)
                 for a in (y, y_i))

        def unfused(x=x, res=res, summed=summed) -> None:
            ar(x, out=summed)
            res.add_(summed)
            F.rms_norm(res, (hidden,), w, 1e-6)

        nccl_in = x.clone()  # NCCL reduces in place: a copy of x, reduced again at each call

        def nccl(b=nccl_in, res=res) -> None:
            dist.all_reduce(b, group=ctx.group)
            res.add_(b)
            F.rms_norm(res, (hidden,), w, 1e-6)

        res_e, res_e_out, out_e = res0.clone(), torch.empty_like(x), torch.empty_like(x)

        def engine(x=x, summed=summed, res=res_e, out=out_e, res_out=res_e_out) -> None:  # the engines' two kernels
            ar(x, out=summed)
            invariant_add_rms_norm(summed, res, w, 1e-6, out=out, residual_out=res_out)

        engine()
        ok = ok and torch.equal(out_e, y_i) and torch.equal(res_e_out, res_u)  # the batch-invariant bits
        times = {"f": timed(lambda x=x, res=res, out=out: norm(x, res, w, out=out)),
                 "i": timed(lambda x=x, res=res, out=out: inv(x, res, w, out=out)),
                 "u": timed(unfused), "n": timed(nccl), "e": timed(engine)}
        if vca is not None and vca.why_not is None:
            ca_out = torch.empty_like(x)
            ca_run = vca.allreduce(x, ca_out)

            def engine_ca(ca_run=ca_run, ca_out=ca_out, res=res_e, out=out_e, res_out=res_e_out) -> None:
                ca_run()  # vLLM's custom all-reduce, then the norm
                invariant_add_rms_norm(ca_out, res, w, 1e-6, out=out, residual_out=res_out)

            engine_ca()
            if ctx.world == 2:  # two addends: any order gives the same bits
                ok = ok and torch.equal(ca_out, summed)
            else:  # vLLM's custom all-reduce sums more ranks in an order of its own
                ok = ok and bool(torch.allclose(ca_out.float(), summed.float(), rtol=2e-2, atol=2e-2))
            times["c"] = timed(engine_ca, vca.register_graph)
        v = max_over_ranks(ctx, times)
        norm_rows.append({"tokens": t, "hidden": hidden, "variant": norm.select(t, hidden), "fused_us": v["f"],
                          "invariant_variant": inv.select(t, hidden), "invariant_us": v["i"],
                          "unfused_tritoncomm_us": v["u"], "unfused_nccl_us": v["n"], "engine_tritoncomm_us": v["e"],
                          "engine_vllm_ca_us": v.get("c"), "correct": all_true(ctx, ok)})
    if vca is not None:
        vca.close()
    inv.close()
    norm.close()
    ar.close()
    comm.close()
    if ctx.rank != 0:
        return None
    import triton

    return {"op": "deterministic", "world": ctx.world, "date": datetime.date.today().isoformat(),
            "vllm_ca": None if vca is None else vca.why_not or "flashinfer.comm.vllm_ar",
            "device": torch.cuda.get_device_name(dev) if ctx.backend == "cuda" else "CPU world",
            "torch": torch.__version__, "triton": triton.__version__,
            "method": f"per call; {mode} mode: 32 calls{' in a CUDA graph' if mode == 'graph' else ''}, median of 20 "
                      "samples per rank, max over ranks", "rows": rows, "norm_rows": norm_rows}


def format_deterministic(rep: dict[str, Any]) -> str:
    lines = [f"deterministic modes: world={rep['world']} device={rep['device']} date={rep['date']} "
             f"torch={rep['torch']} triton={rep['triton']}; {rep['method']}",
             f"{'bytes':>9} {'algo':>15} {'ok':>3} {'tritoncomm':>10} {'NCCL':>9} {'xNCCL':>6}"]
    for r in rep["rows"]:
        lines.append(f"{format_bytes(r['bytes']):>9} {r['algo']:>15} {'yes' if r['correct'] else 'NO':>3} "
                     f"{fmt(r['tritoncomm_us'], '10.1f')} {fmt(r['nccl_us'])} "
                     f"{r['nccl_us'] / r['tritoncomm_us']:6.2f}")
    lines.append(f"{'tokens':>9} {'variant':>15} {'ok':>3} {'fused':>8} {'invariant':>9} {'AR+add+norm':>11} "
                 f"{'NCCL+add+norm':>13} {'AR+norm1':>8} {'vLLM-CA+norm1':>13} {'xAR':>5} {'xNCCL':>5} "
                 f"{'xnorm1':>6} {'xvLLM':>5}")
    for r in rep["norm_rows"]:
        inv = r.get("invariant_us") or r["fused_us"]
        eng, ca = r.get("engine_tritoncomm_us"), r.get("engine_vllm_ca_us")
        lines.append(f"{r['tokens']:>9} {r['variant']:>15} {'yes' if r['correct'] else 'NO':>3} "
                     f"{fmt(r['fused_us'], '8.1f')} {fmt(r.get('invariant_us'), '9.1f')} "
                     f"{fmt(r['unfused_tritoncomm_us'], '11.1f')} {fmt(r['unfused_nccl_us'], '13.1f')} "
                     f"{fmt(eng, '8.1f')} {fmt(ca, '13.1f')} {r['unfused_tritoncomm_us'] / inv:5.2f} "
                     f"{r['unfused_nccl_us'] / inv:5.2f} {fmt(eng and eng / inv, '6.2f')} "
                     f"{fmt(ca and ca / inv, '5.2f')}")
    return "\n".join(lines)
