"""Benchmarks in the style of nccl-tests: tritoncomm next to NCCL and torch symmetric memory.

For every size: the algorithm tritoncomm picks, its time, algbw and busbw, and the baselines'
times measured in the same run on the same data, in graph mode (32 calls captured in a CUDA graph,
median of replays) and eager mode (32 launches back to back); each rank's median, max over ranks.
Each size is first checked against torch.distributed on random data (and across ranks).

Baselines: NCCL through torch.distributed; for all-reduce also torch's symmetric-memory one-shot
and two-shot (``torch.ops.symm_mem``, on buffers already in symmetric memory; multicast off).
"""

from __future__ import annotations

import datetime
import hashlib
import math
from typing import Any

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import AllGather, AllReduce, AllToAll, ReduceScatter, SelectionTable
from ..config import CommConfig
from ..launch import RankContext
from ..units import format_bytes
from .peers import FI_HIDDEN, FlashInferAllReduce, VllmCustomAllReduce, fi_shape, symm_mem_ops
from .report import DTYPES, TOL, all_true, fmt, max_over_ranks
from .timing import time_per_call_us

__all__ = ["bench_rank", "format_bench", "format_zero_copy", "plot_bench", "zero_copy_rank"]



def bench_rank(ctx: RankContext, op: str, sizes: list[int], dtype_name: str, modes: list[str],
               table_json: dict | None = None) -> dict[str, Any] | None:
    dtype = DTYPES[dtype_name]
    esize = torch.tensor([], dtype=dtype).element_size()
    w = ctx.world
    max_bytes = max(sizes)
    symmetric = op == "allreduce"  # also time the all-reduce on symmetric tensors (comm.empty)
    heap_bytes = (5 if symmetric else 3) * max_bytes + (64 << 20)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap_bytes, timeout_s=60))
    table = None
    if table_json is not None:
        from ..collectives import load_table

        base = load_table(comm.backend, torch.cuda.get_device_name(ctx.device) if comm.backend == "cuda" else "")
        table = base.merged(SelectionTable.from_json(table_json, "bench --table"))
    coll: Any
    if op == "allreduce":
        coll = AllReduce(comm, max_bytes=max_bytes, table=table)
    elif op == "allgather":
        coll = AllGather(comm, max_bytes=max_bytes, table=table)
    elif op == "alltoall":
        coll = AllToAll(comm, max_bytes=max_bytes, table=table)
    else:
        coll = ReduceScatter(comm, max_bytes=max_bytes, table=table)

    hx_all = hout_all = rout_all = None
    if symmetric:
        hx_all, hout_all = comm.empty(max_bytes // esize, dtype), comm.empty(max_bytes // esize, dtype)
    # regular outputs mapped into peers (GPU world): the all-reduce's two-shot, the direct all-gather
    registered = op in ("allreduce", "allgather", "alltoall") and comm.backend == "cuda"
    if registered:
        rout_all = torch.empty(max_bytes // esize, dtype=dtype, device=ctx.device)
        comm.register(rout_all)

    # the engines' all-reduces, timed beside ours (bf16 only; GPUs only)
    peers = op == "allreduce" and comm.backend == "cuda" and dtype == torch.bfloat16
    fi = FlashInferAllReduce(ctx, max(1, max_bytes // esize // FI_HIDDEN)) if peers else None
    vca = VllmCustomAllReduce(ctx, min(max_bytes, VLLM_CA_MAX_BYTES)) if peers else None
    peer_out = torch.empty(max_bytes // esize, dtype=dtype, device=ctx.device) if peers else None

    rows = []
    for nbytes in sizes:
        n = max(w, nbytes // esize // w * w)  # divisible by the world for allgather/reducescatter
        gen = torch.Generator().manual_seed(7 * n + ctx.rank)
        if op == "allreduce":
            x = torch.randn(n, generator=gen).to(dtype).to(ctx.device)
            out = torch.full_like(x, float("nan"))
            ref = x.float().clone()
            dist.all_reduce(ref, group=ctx.group)
            coll(x, out)
            algo = coll.select(n * esize, dtype)
            nccl_buf = x.clone()

            def nccl(b=nccl_buf) -> None:
                dist.all_reduce(b, group=ctx.group)
        elif op == "allgather":
            x = torch.randn(n // w, generator=gen).to(dtype).to(ctx.device)
            out = torch.full((n,), float("nan"), dtype=dtype, device=ctx.device)
            ref = torch.empty(n, dtype=torch.float32, device=ctx.device)
            dist.all_gather_into_tensor(ref, x.float(), group=ctx.group)
            coll(x, out)
            algo = "push" if n * esize <= coll.max_bytes else "fallback"
            nccl_out = torch.empty_like(out)

            def nccl(x=x, o=nccl_out) -> None:
                dist.all_gather_into_tensor(o, x, group=ctx.group)
        elif op == "alltoall":
            x = torch.randn(n, generator=gen).to(dtype).to(ctx.device)
            out = torch.full_like(x, float("nan"))
            ref = torch.empty(n, dtype=torch.float32, device=ctx.device)
            dist.all_to_all_single(ref, x.float(), group=ctx.group)
            coll(x, out)
            algo = "push" if n * esize <= coll.max_bytes else "fallback"
            nccl_out = torch.empty_like(out)

            def nccl(x=x, o=nccl_out) -> None:
                dist.all_to_all_single(o, x, group=ctx.group)
        else:
            x = torch.randn(n, generator=gen).to(dtype).to(ctx.device)
            out = torch.full((n // w,), float("nan"), dtype=dtype, device=ctx.device)
            full = x.float().clone()
            dist.all_reduce(full, group=ctx.group)
            ref = full[ctx.rank * (n // w):(ctx.rank + 1) * (n // w)]
            coll(x, out)
            algo = "push" if n * esize <= coll.max_bytes else "fallback"
            nccl_out = torch.empty_like(out)

            def nccl(x=x, o=nccl_out) -> None:
                dist.reduce_scatter_tensor(o, x, group=ctx.group)
        comm.synchronize()
        o = out.float()
        err = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        correct = bool(not torch.isnan(o).any().item() and err <= TOL[dtype])
        digests: list[Any] = [None] * w
        dist.all_gather_object(digests, hashlib.sha1(out.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
                               if op in ("allreduce", "allgather") else 0,  # the same on every rank
                               group=ctx.cpu_group)
        times: dict[str, float | None] = {}
        for mode in modes:
            times[f"tritoncomm_{mode}"] = time_per_call_us(lambda x=x, out=out: coll(x, out), ctx.device, ctx.barrier,
                                                           mode=mode)
            times[f"nccl_{mode}"] = time_per_call_us(nccl, ctx.device, ctx.barrier, mode=mode)
        heap_same = None
        if symmetric:  # the same data in symmetric tensors: what torch symm_mem is timed on
            hx, hout = hx_all[:n], hout_all[:n]
            hx.copy_(x)
            hout.fill_(float("nan"))
            coll(hx, hout)
            heap_same = bool(torch.equal(hout, out))
            times["heap_graph"] = time_per_call_us(lambda hx=hx, hout=hout: coll(hx, hout), ctx.device, ctx.barrier)
        reg_same = None
        if registered:  # a regular input and a registered regular output (Communicator.register)
            rout = rout_all[:out.numel()]
            rout.fill_(float("nan"))
            kw = {"direct": True} if op in ("allgather", "alltoall") else {}  # their direct forms at every size
            coll(x, rout, **kw)
            reg_same = bool(torch.equal(rout, out))
            times["reg_graph"] = time_per_call_us(lambda x=x, rout=rout, kw=kw: coll(x, rout, **kw), ctx.device,
                                                  ctx.barrier)
        if op == "allreduce" and ctx.backend == "cuda":
            sm = symm_mem_ops(ctx, n, dtype)
            for kind in ("one_shot", "two_shot"):
                if kind in sm:
                    try:
                        sm["buf"].copy_(x)
                        times[f"symm_{kind}"] = time_per_call_us(sm[kind], ctx.device, ctx.barrier, mode="graph")
                    except Exception:
                        times[f"symm_{kind}"] = None
                else:
                    times[f"symm_{kind}"] = None
            del sm
        peer_ok = True
        if peers:
            checked = _time_peers(ctx, fi, vca, x, peer_out[:n], ref, TOL[dtype])
            peer_ok = checked.pop("ok")
            times.update(checked)
        comm.synchronize()
        t = max_over_ranks(ctx, times)
        mode0 = modes[0]
        us = t[f"tritoncomm_{mode0}"]
        full_bytes = n * esize
        algbw = full_bytes / (us * 1e3) if us else None  # GB/s
        factor = 2 * (w - 1) / w if op == "allreduce" else (w - 1) / w
        symm = [v for k, v in t.items() if k.startswith("symm_") and v is not None]
        rows.append({
            "bytes": full_bytes, "dtype": dtype_name, "algo": algo, "correct": correct,
            "identical": all(d == digests[0] for d in digests), "max_rel_err": err,
            "tritoncomm_us": us, "nccl_us": t[f"nccl_{mode0}"], "symm_mem_us": min(symm) if symm else None,
            "symm_one_shot_us": t.get("symm_one_shot"), "symm_two_shot_us": t.get("symm_two_shot"),
            **({"tritoncomm_heap_us": t["heap_graph"], "heap_same_bits": all_true(ctx, heap_same)}
               if symmetric else {}),
            **({"tritoncomm_registered_us": t["reg_graph"], "registered_same_bits": all_true(ctx, reg_same)}
               if registered else {}),
            "algbw_GBps": algbw, "busbw_GBps": algbw * factor if algbw else None,
            **{f"{k}_us": v for k, v in t.items() if k.endswith("_eager")},
            **(_peer_columns(t, all_true(ctx, peer_ok)) if peers else {}),
        })
    workspace = coll.workspace_bytes
    if symmetric:
        comm.free(hout_all)
        comm.free(hx_all)
    coll.close()
    comm.close()
    for p in (fi, vca):
        if p is not None:
            p.close()
    if ctx.rank != 0:
        return None
    import triton

    return {
        "op": op, "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world",
        "date": datetime.date.today().isoformat(), "torch": torch.__version__, "triton": triton.__version__,
        "world": w, "dtype": dtype_name, "backend": ctx.backend, "modes": modes, "workspace_bytes": workspace,
        "workspace_over_largest_message": workspace / max(r["bytes"] for r in rows),
        "method": f"{modes[0]} mode: per call, 32 calls, median of 20 samples per rank, max over ranks"
                  + ("; heap_us: the same all-reduce on symmetric tensors (comm.empty), as torch symm_mem is "
                     "timed on its symmetric buffer; xSYMM compares those two" if symmetric else "")
                  + ("; reg_us: a regular input and a registered regular output (Communicator.register)"
                     + ("; the direct form (entry barrier, stores into every rank's output)"
                        if op in ("allgather", "alltoall") else "") if registered else ""),
        **({"peers": {"flashinfer": fi.why_not or "timed", "vllm_ca": vca.why_not or "timed"}} if peers else {}),
        "rows": rows,
    }


#: vLLM's custom all-reduce is set up for at most this many bytes (its shared buffers: twice that per rank).
VLLM_CA_MAX_BYTES = 64 << 20


def _time_peers(ctx: RankContext, fi: FlashInferAllReduce, vca: VllmCustomAllReduce, x: torch.Tensor,
                out: torch.Tensor, ref: torch.Tensor, tol: float) -> dict[str, Any]:
    """Graph-mode times of FlashInfer's TRT-LLM all-reduce (its own choice, one-shot, two-shot) and of
    vLLM's custom all-reduce on ``x``, each first checked against ``ref``; None where a peer cannot
    serve this size. ``ok``: every result that ran was right."""
    times: dict[str, Any] = {"flashinfer_auto": None, "flashinfer_oneshot": None, "flashinfer_twoshot": None,
                             "vllm_ca": None}
    ok = True

    def check_and_time(key: str, fn, after_capture=None) -> None:
        nonlocal ok
        try:
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            good = bool(((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item() <= tol)
        except Exception:  # this peer cannot serve this shape
            torch.cuda.synchronize()
            good = None
        if not all_true(ctx, good is not None):  # the same decision on every rank
            return
        ok &= all_true(ctx, good)
        times[key] = time_per_call_us(fn, ctx.device, ctx.barrier, after_capture=after_capture)

    shape = fi_shape(x.numel())
    if fi.ws is not None and shape is not None:
        x2, o2 = x.view(*shape), out.view(*shape)
        check_and_time("flashinfer_auto", fi.allreduce(x2, o2, None))
        check_and_time("flashinfer_oneshot", fi.allreduce(x2, o2, True))
        if shape[0] > 2:  # its two-shot needs more than 2 rows
            check_and_time("flashinfer_twoshot", fi.allreduce(x2, o2, False))
    if vca.fa is not None and x.numel() * x.element_size() <= vca.max_bytes:
        check_and_time("vllm_ca", vca.allreduce(x, out), vca.register_graph)
    return {**times, "ok": ok}


def _peer_columns(t: dict[str, float | None], ok: bool) -> dict[str, Any]:
    fis = [t[k] for k in ("flashinfer_auto", "flashinfer_oneshot", "flashinfer_twoshot") if t.get(k)]
    return {"flashinfer_us": min(fis) if fis else None, "flashinfer_auto_us": t.get("flashinfer_auto"),
            "flashinfer_oneshot_us": t.get("flashinfer_oneshot"), "flashinfer_twoshot_us": t.get("flashinfer_twoshot"),
            "vllm_ca_us": t.get("vllm_ca"), "peers_correct": ok}


def format_bench(rep: dict[str, Any]) -> str:
    ar = rep["op"] == "allreduce"
    lines = [f"{rep['op']}: world={rep['world']} device={rep['device']} date={rep['date']} torch={rep['torch']} "
             f"triton={rep['triton']}; {rep['method']}; workspace {rep['workspace_bytes'] / 2**20:.0f} MiB "
             f"({rep['workspace_over_largest_message']:.2f}x the largest message)",
             f"{'bytes':>6} {'algo':>8} {'ok':>3} {'us':>8} {'algbw':>7} {'busbw':>7} {'nccl_us':>8} {'xNCCL':>6}"
             + (f" {'heap_us':>8} {'symm1_us':>8} {'symm2_us':>8} {'xSYMM':>6}" if ar else "")
             + (f" {'reg_us':>8}" if "tritoncomm_registered_us" in rep["rows"][0] else "")
             + (f" {'fi_us':>8} {'fi1_us':>8} {'fi2_us':>8} {'vllm_us':>8} {'xPEER':>6}"
                if "flashinfer_us" in rep["rows"][0] else "")
             + (f" {'eager_us':>8} {'nccl_eg':>8}" if "tritoncomm_eager_us" in rep["rows"][0] else "")]
    speedups: list[float] = []
    reg_speedups: list[float] = []
    for r in rep["rows"]:
        sp = r["nccl_us"] / r["tritoncomm_us"] if r["nccl_us"] and r["tritoncomm_us"] else None
        if sp and r["bytes"] >= 8192:
            speedups.append(sp)
        line = (f"{format_bytes(r['bytes']):>6} {r['algo']:>8} {'yes' if r['correct'] and r['identical'] else 'NO':>3} "
                f"{fmt(r['tritoncomm_us'], '8.1f')} {fmt(r['algbw_GBps'], '7.1f')} {fmt(r['busbw_GBps'], '7.1f')} "
                f"{fmt(r['nccl_us'], '8.1f')} {fmt(sp, '6.2f')}")
        if ar:
            mine = r.get("tritoncomm_heap_us") or r["tritoncomm_us"]
            ssp = r["symm_mem_us"] / mine if r["symm_mem_us"] and mine else None
            line += (f" {fmt(r.get('tritoncomm_heap_us'), '8.1f')} {fmt(r['symm_one_shot_us'], '8.1f')} "
                     f"{fmt(r['symm_two_shot_us'], '8.1f')} {fmt(ssp, '6.2f')}")
        if "tritoncomm_registered_us" in r:
            line += f" {fmt(r['tritoncomm_registered_us'], '8.1f')}"
            if r["nccl_us"] and r["tritoncomm_registered_us"] and r["bytes"] >= 8192:
                reg_speedups.append(r["nccl_us"] / r["tritoncomm_registered_us"])
        if "flashinfer_us" in r:
            mine = min(v for v in (r["tritoncomm_us"], r.get("tritoncomm_registered_us")) if v)
            best = min((v for v in (r["flashinfer_us"], r["vllm_ca_us"], r["symm_mem_us"], r["nccl_us"]) if v),
                       default=None)
            line += (f" {fmt(r['flashinfer_us'], '8.1f')} {fmt(r['flashinfer_oneshot_us'], '8.1f')} "
                     f"{fmt(r['flashinfer_twoshot_us'], '8.1f')} {fmt(r['vllm_ca_us'], '8.1f')} "
                     f"{fmt(best / mine if best and mine else None, '6.2f')}")
        if "tritoncomm_eager_us" in r:
            line += f" {fmt(r['tritoncomm_eager_us'], '8.1f')} {fmt(r.get('nccl_eager_us'), '8.1f')}"
        lines.append(line)
    for what, sps in (("", speedups), (" with registered outputs", reg_speedups)):
        if sps:
            geo = math.exp(sum(math.log(s) for s in sps) / len(sps))
            lines.append(f"geomean speedup over NCCL{what} (>= 8 KB): {geo:.2f}x; min {min(sps):.2f}x")
    return "\n".join(lines)


def plot_bench(reports: list[dict[str, Any]], path: str) -> None:
    """Latency against size, one line per system, one panel per report (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 4.5), squeeze=False)
    for ax, rep in zip(axes[0], reports, strict=True):
        xs = [r["bytes"] for r in rep["rows"]]
        series = [("tritoncomm", "tritoncomm_us"), ("NCCL", "nccl_us")]
        if rep["op"] == "allreduce":
            series += [("tritoncomm, registered output", "tritoncomm_registered_us"),
                       ("symm_mem one-shot", "symm_one_shot_us"), ("symm_mem two-shot", "symm_two_shot_us"),
                       ("FlashInfer TRT-LLM (best mode)", "flashinfer_us"), ("vLLM custom AR", "vllm_ca_us")]
        for label, key in series:
            pts = [(x, r[key]) for x, r in zip(xs, rep["rows"], strict=True) if r.get(key)]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("µs per call (CUDA graph)")
        ax.set_title(f"{rep['op']} {rep['dtype'] if 'dtype' in rep else ''} TP{rep['world']} {rep['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def zero_copy_rank(ctx: RankContext, sizes: list[int] | None = None) -> dict[str, Any] | None:
    """All-reduce (the table's choice) on regular tensors vs on symmetric tensors from
    ``comm.empty`` (input and output in the heap: the two-shot pushes straight from the input and writes
    peers' outputs, no copy-out), vs a regular input with a symmetric output (the same form), with NCCL, one run."""
    sizes = sizes or [1 << 20, 8 << 20, 32 << 20, 128 << 20]
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=5 * max(sizes) + (64 << 20)))
    ar = AllReduce(comm, max_bytes=max(sizes))
    xs, outs = comm.empty(max(sizes) // 2), comm.empty(max(sizes) // 2)

    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
        out = torch.empty_like(x)
        hx, hout = xs[:n], outs[:n]
        hx.copy_(x)
        staged = ar(x, out=out).clone()
        ar(hx, out=hout)
        ok = bool(torch.equal(staged, hout))
        nb = x.clone()
        t = {"staged": time_per_call_us(lambda x=x, out=out: ar(x, out=out), ctx.device, ctx.barrier),
             "heap": time_per_call_us(lambda hx=hx, hout=hout: ar(hx, out=hout), ctx.device, ctx.barrier),
             "heap_out": time_per_call_us(lambda x=x, hout=hout: ar(x, out=hout), ctx.device, ctx.barrier),
             "nccl": time_per_call_us(lambda nb=nb: dist.all_reduce(nb, group=ctx.group), ctx.device, ctx.barrier)}
        t = max_over_ranks(ctx, t)
        rows.append({"bytes": nbytes, "algo": ar.select(nbytes), "staged_us": t["staged"], "heap_us": t["heap"],
                     "heap_out_us": t["heap_out"],
                     "nccl_us": t["nccl"], "same_bits": all_true(ctx, ok)})
    comm.free(outs)
    comm.free(xs)
    ar.close()
    comm.close()
    if ctx.rank != 0:
        return None
    return {"op": "zero_copy", "world": ctx.world, "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world",
            "method": "per call in CUDA graphs (32 calls, median of 20 replays), max over ranks", "rows": rows}


def format_zero_copy(rep: dict[str, Any]) -> str:
    lines = [f"zero-copy all-reduce: world={rep['world']} device={rep['device']} date={rep['date']}",
             f"{'bytes':>11} {'algo':>8} {'staged':>9} {'heap':>9} {'heap out':>9} {'NCCL':>9}  same bits"]
    for r in rep["rows"]:
        lines.append(f"{r['bytes']:>11} {r['algo']:>8} {fmt(r['staged_us'])} {fmt(r['heap_us'])} "
                     f"{fmt(r.get('heap_out_us'))} {fmt(r['nccl_us'])}  "
                     f"{r['same_bits']}")
    return "\n".join(lines)
