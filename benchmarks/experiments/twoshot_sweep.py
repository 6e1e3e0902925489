"""Experiment: where does the two-shot all-reduce lose time at large sizes, and which launch shape
or loop form wins? Not part of the library; run on a GPU machine:

    PYTHONPATH=. python3 benchmarks/experiments/twoshot_sweep.py --world 4 --json out.json

Times (CUDA graphs, 32 calls, median of replays, max over ranks), in one run per world:
* the shipped two-shot kernel on regular tensors ("staged") and on symmetric tensors ("heap"),
  over programs x block x warps;
* an experimental copy that can skip phases (1 = reduce-scatter push, 2 = reduce + all-gather
  push, 4 = copy-out), to split the time between phases, with the pushes and the copy-out either as
  shipped ("lf1": loads first, one 2-D access per block) or as before 2026-11-21 ("lf0": W-1
  load->store pairs per block). The shipped kernel's own rows used the loop form when the
  2026-11-21 sweep was measured (results/raw/session3/sweep*.json);
* NCCL and torch symmetric memory's two-shot on the same sizes.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from tritoncomm.bench import _max_over_ranks, _symm_mem_ops
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, Choice, SelectionTable
from tritoncomm.collectives.allreduce_twoshot import (
    twoshot_gather_block,
    twoshot_reduce_block,
    twoshot_scatter_block,
)
from tritoncomm.collectives.tuning import DTYPE_NAMES
from tritoncomm.config import CommConfig
from tritoncomm.kernels import barrier, epoch_commit, heap_ptr, program_epoch
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us
from tritoncomm.units import parse_size


@triton.jit
def _scatter_loop(x_ptr, n, shard, b, bases, rank, rs_off, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """The reduce-scatter push as it was before the 2-D form: W-1 load->store pairs per block."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    j = b * BLOCK + tl.arange(0, BLOCK)
    for s in tl.static_range(WORLD):
        if s != rank:
            m = (j < shard) & (s * shard + j < n)
            dst = heap_ptr(bases, s, rs_off + rank * shard * (DTYPE.primitive_bitwidth // 8), DTYPE)
            tl.store(dst + j, tl.load(x_ptr + s * shard + j, mask=m), mask=m)


@triton.jit
def _gather_loop(out_ptr, n, shard, b, bases, rank, ag_off, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """The copy-out as it was before the 2-D form: W-1 load->store pairs per block."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    j = b * BLOCK + tl.arange(0, BLOCK)
    src = heap_ptr(bases, rank, ag_off, DTYPE)
    for s in tl.static_range(WORLD):
        if s != rank:
            m = (j < shard) & (s * shard + j < n)
            tl.store(out_ptr + s * shard + j, tl.load(src + s * shard + j, mask=m), mask=m)


@triton.jit(do_not_specialize=["rank"])
def xp_kernel(x_ptr, out_ptr, n, shard, bases, rank, timeout, diag_addr, flags_off, epochs_off, rs_off, ag_off, active,
              WORLD: tl.constexpr, BLOCK: tl.constexpr, PHASES: tl.constexpr, LF: tl.constexpr):
    pid = tl.program_id(0)
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(shard, BLOCK) - pid, active)
        if PHASES & 1:
            for i in range(0, iters):
                if LF:  # the shipped 2-D form
                    twoshot_scatter_block(x_ptr, n, shard, pid + i * active, bases, rank, rs_off, WORLD, BLOCK)
                else:
                    _scatter_loop(x_ptr, n, shard, pid + i * active, bases, rank, rs_off, WORLD, BLOCK)
        barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
        if PHASES & 2:
            for i in range(0, iters):
                twoshot_reduce_block(x_ptr, out_ptr, n, shard, pid + i * active, bases, rank, rs_off, ag_off, WORLD,
                                     BLOCK)
        barrier(bases, rank, WORLD, flags_off, pid + tl.num_programs(0), e, timeout, diag)
        if PHASES & 4:
            for i in range(0, iters):
                if LF:
                    twoshot_gather_block(out_ptr, n, shard, pid + i * active, bases, rank, ag_off, WORLD, BLOCK)
                else:
                    _gather_loop(out_ptr, n, shard, pid + i * active, bases, rank, ag_off, WORLD, BLOCK)
    epoch_commit(epoch_ptr, e)


SHAPES = [(p, b, w) for p in (64, 128) for b in (2048, 8192, 16384) for w in (8, 16)]
XP = [(7, 0, 64, 8192, 8), (1, 0, 64, 8192, 8), (2, 0, 64, 8192, 8), (4, 0, 64, 8192, 8),
      (7, 1, 64, 8192, 8), (1, 1, 64, 8192, 8), (4, 1, 64, 8192, 8), (7, 1, 128, 8192, 8), (7, 1, 64, 16384, 16),
      (7, 1, 128, 4096, 8)]


def sweep_rank(ctx, sizes: list[int], quick: bool = False) -> dict | None:
    w = ctx.world
    shapes, xps = (SHAPES[:1], [XP[0], XP[4]]) if quick else (SHAPES, XP)
    big = max(sizes)
    gpu = ctx.backend == "cuda"
    heap = 5 * big + (64 << 20) if gpu else 8 * big + (8 << 20)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap, timeout_s=60))
    cands = [Choice("twoshot", p, b, nw) for p, b, nw in sorted(set(SHAPES + [x[2:] for x in XP]))]
    grid_table = SelectionTable({("allreduce", w, d): [(i + 1, c) for i, c in enumerate(cands)] for d in DTYPE_NAMES},
                                "sweep")
    ar = AllReduce(comm, max_bytes=big, table=grid_table, algos={"twoshot": big})
    hx_all, hout_all = comm.empty(big // 2), comm.empty(big // 2)
    ch = ar._channels["twoshot"]
    grid = ar._grids["twoshot"]

    bases, rank, _, timeout, diag = comm.kernel_args()

    def timed(fn) -> float:
        return time_per_call_us(fn, ctx.device, ctx.barrier, replays=10)

    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        gen = torch.Generator().manual_seed(1234 + ctx.rank)
        x = torch.randn(n, generator=gen).to(torch.bfloat16).to(ctx.device)
        out = torch.empty_like(x)
        hx, hout = hx_all[:n], hout_all[:n]
        hx.copy_(x)
        ref = x.float().clone()
        dist.all_reduce(ref, group=ctx.group)
        t: dict[str, float | None] = {}
        for p, b, nw in shapes:
            ar.table = SelectionTable({("allreduce", w, d): [(1 << 62, Choice("twoshot", p, b, nw))]
                                       for d in DTYPE_NAMES}, "one")
            t[f"staged p{p} b{b} w{nw}"] = timed(lambda x=x, out=out: ar(x, out))
            t[f"heap p{p} b{b} w{nw}"] = timed(lambda hx=hx, hout=hout: ar(hx, hout))
        shard = (-(-n // w) + 15) // 16 * 16
        ok = True
        for phases, lf, p, b, nw in xps:
            def run(phases=phases, lf=lf, p=p, b=b, nw=nw, x=x, out=out, n=n, shard=shard) -> None:
                xp_kernel[(grid,)](x, out, n, shard, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off,
                                   ch.buffer_off, ch.buffer_off + w * ar._shard_cap, p, WORLD=w, BLOCK=b,
                                   PHASES=phases, LF=lf, num_warps=nw)
            if phases == 7:
                out.fill_(float("nan"))
                run()
                comm.synchronize()
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                ok = ok and err < 2e-2
            t[f"xp ph{phases} lf{lf} p{p} b{b} w{nw}"] = timed(run)
        nb = x.clone()
        t["nccl"] = timed(lambda nb=nb: dist.all_reduce(nb, group=ctx.group))
        sm = _symm_mem_ops(ctx, n, torch.bfloat16) if ctx.backend == "cuda" else {}
        for kind in ("one_shot", "two_shot"):
            if kind in sm and not (kind == "one_shot" and nbytes > (8 << 20)):
                try:
                    sm["buf"].copy_(x)
                    t[f"symm {kind}"] = timed(sm[kind])
                except Exception as ex:
                    print("symm", kind, ex, file=sys.stderr)
        del sm
        t = _max_over_ranks(ctx, {k: v for k, v in t.items()})
        oks: list = [None] * w
        dist.all_gather_object(oks, ok, group=ctx.cpu_group)
        rows.append({"bytes": nbytes, "xp_correct": all(oks), "us": t})
        if ctx.rank == 0:
            best = sorted((v, k) for k, v in t.items() if v is not None)[:6]
            print(f"{nbytes >> 10} KiB: " + ", ".join(f"{k}={v:.1f}" for v, k in best), flush=True)
    comm.free(hout_all)
    comm.free(hx_all)
    ar.close()
    comm.close()
    if ctx.rank:
        return None
    return {"world": w, "device": torch.cuda.get_device_name(ctx.device) if gpu else "CPU world", "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="1M,2M,8M,32M,128M")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="one shape per form (a smoke test)")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rep = launch(sweep_rank, a.world, sizes, a.quick, timeout=560)[0]
    for r in rep["rows"]:
        print(f"\n== {r['bytes'] >> 10} KiB (world {rep['world']}, xp correct {r['xp_correct']})")
        for k, v in sorted(r["us"].items(), key=lambda kv: (kv[1] is None, kv[1])):
            print(f"  {k:32s} {v:9.1f}" if v is not None else f"  {k:32s}         -")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
