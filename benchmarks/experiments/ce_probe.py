"""Experiment: can copy engines (CE) plus stream memory operations beat SM pushes for large
all-reduces, and overlap an all-reduce with cuBLAS? Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/ce_probe.py --world 4 --json ce.json

Measures, CUDA graphs, max over ranks:
- CE egress: S/W bytes to each of W-1 peers (one stream per peer, or one stream for all);
- a memop barrier (cuStreamWriteValue32 into every peer's flag, cuStreamWaitValue32 + reset);
- a CE all-reduce: RS push by CE, memop barrier, Triton reduce of my shard, AG push by CE,
  memop barrier, copy-out; with the output symmetric (no copy-out) too; NCCL beside;
- GEMM (cuBLAS, N-slices) + CE all-reduce of each slice on a side stream vs matmul + NCCL.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from cuda.bindings import driver as cu

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us
from tritoncomm.units import parse_size

WF = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
WAIT_EQ = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ


def _ok(res, what):
    err = res[0] if isinstance(res, tuple) else res
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")


def write32(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _ok(cu.cuStreamWriteValue32(cu.CUstream(stream.cuda_stream), cu.CUdeviceptr(addr), value, WF), "write32")


def wait32(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    _ok(cu.cuStreamWaitValue32(cu.CUstream(stream.cuda_stream), cu.CUdeviceptr(addr), value, WAIT_EQ), "wait32")


@triton.jit(do_not_specialize=["rank"])
def reduce_kernel(x_ptr, rs_ptr, out_ptr, shard, rank, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """out[j] = sum over s = 0..W-1 of (x[j] if s == rank else rs[s, j]), fp32, fixed order."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < shard
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(WORLD):
        if s == rank:
            acc += tl.load(x_ptr + j, mask=m).to(tl.float32)
        else:
            acc += tl.load(rs_ptr + s * shard + j, mask=m).to(tl.float32)
    tl.store(out_ptr + j, acc.to(out_ptr.dtype.element_ty), mask=m)


class CEAllReduce:
    def __init__(self, comm: Communicator, max_bytes: int, esize: int = 2) -> None:
        self.comm = comm
        w, r = comm.world, comm.rank
        self.w, self.r = w, r
        self.shard_cap = -(-max_bytes // w) + 256
        self.rs = comm.heap.alloc(w * self.shard_cap, "ce.rs")
        self.ag = comm.heap.alloc(w * self.shard_cap, "ce.ag")
        self.flags = comm.heap.alloc(4 * 2 * 8, "ce.flags")  # [phase][peer]
        comm.heap.view(self.flags).zero_()
        torch.cuda.synchronize()
        comm.heap.verify()
        self.side = [torch.cuda.Stream(comm.device, priority=-1) for _ in range(w)]
        self.ev = [torch.cuda.Event() for _ in range(w + 1)]
        self.esize = esize

    def flag_addr(self, peer: int, phase: int, slot: int) -> int:
        return self.comm.heap.peer_addr(peer, self.flags) + 4 * (phase * 8 + slot)

    def _fan(self, main, fn) -> None:
        """fn(stream, peer) on one side stream per peer, forked from and joined to main."""
        self.ev[self.w].record(main)
        for p in range(self.w):
            if p == self.r:
                continue
            s = self.side[p]
            s.wait_event(self.ev[self.w])
            with torch.cuda.stream(s):
                fn(s, p)
            self.ev[p].record(s)
        for p in range(self.w):
            if p != self.r:
                main.wait_event(self.ev[p])

    def _waitall(self, main, phase: int) -> None:
        for p in range(self.w):
            if p != self.r:
                a = self.flag_addr(self.r, phase, p)
                wait32(main, a, 1)
                write32(main, a, 0)

    def _signal_all(self, main, phase: int) -> None:
        for p in range(self.w):
            if p != self.r:
                write32(main, self.flag_addr(p, phase, self.r), 1)

    def _phase(self, main, phase: int, push, one_stream: bool) -> None:
        """``push(stream, peer)`` to every peer (each ends with its signal), or only the signals
        when ``push`` is None; then wait for every peer's signal of this phase."""
        if push is None:
            self._signal_all(main, phase)
        elif one_stream:
            for p in range(self.w):
                if p != self.r:
                    push(main, p)
        else:
            self._fan(main, push)
        self._waitall(main, phase)

    def barrier(self, main) -> None:
        """Two handshakes: a slot is written again only after its reader passed the other one."""
        for phase in (0, 1):
            self._signal_all(main, phase)
            self._waitall(main, phase)

    def __call__(self, x: torch.Tensor, out: torch.Tensor, sym_out: bool = False, one_stream: bool = False,
                 phases: str = "rad") -> None:
        main = torch.cuda.current_stream()
        w, r, heap = self.w, self.r, self.comm.heap
        n = x.numel()
        shard = n // w
        sb = shard * x.element_size()
        xb = x.view(torch.uint8)
        ob = out.view(torch.uint8)
        mem = heap.memory

        def rs_push(s, p):
            mem.peer_view(p, self.rs.offset + r * sb, sb).copy_(xb[p * sb:(p + 1) * sb])
            write32(s, self.flag_addr(p, 0, r), 1)

        self._phase(main, 0, rs_push if "r" in phases else None, one_stream)
        if "a" in phases:
            rsv = heap.view(self.rs)[:w * sb].view(x.dtype)
            BLOCK = 2048
            reduce_kernel[(triton.cdiv(shard, BLOCK),)](x[r * shard:], rsv, out[r * shard:], shard, r, WORLD=w,
                                                      BLOCK=BLOCK, num_warps=8)

        def ag_push(s, p):
            if sym_out:
                dst = mem.peer_view(p, self._out_off + r * sb, sb)
            else:
                dst = mem.peer_view(p, self.ag.offset + r * sb, sb)
            dst.copy_(ob[r * sb:(r + 1) * sb])
            write32(s, self.flag_addr(p, 1, r), 1)

        self._phase(main, 1, ag_push if "d" in phases else None, one_stream)
        if "d" in phases:
            if not sym_out:
                agv = heap.view(self.ag)[:w * sb]
                if r > 0:
                    ob[:r * sb].copy_(agv[:r * sb])
                if r < w - 1:
                    ob[(r + 1) * sb:w * sb].copy_(agv[(r + 1) * sb:w * sb])


def probe_rank(ctx, sizes: list[int], gemm_ms: list[int], tp_k: int) -> dict | None:
    big = max(sizes)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=6 * big + (64 << 20), timeout_s=60))
    ar = AllReduce(comm, max_bytes=big)
    ce = CEAllReduce(comm, big)
    hout_all = comm.empty(big // 2, torch.bfloat16)
    ce._out_off = comm.heap_offset(hout_all)
    w, r = ctx.world, ctx.rank

    def t(fn, label=""):
        if r == 0:
            print("  timing", label, flush=True)
        return time_per_call_us(fn, ctx.device, ctx.barrier, replays=10)

    rows = []
    # memop barrier alone
    tb = t(lambda: ce.barrier(torch.cuda.current_stream()), "memop barrier")
    rows.append(_max_over_ranks(ctx, {"memop_barrier_us": tb}))
    if r == 0:
        print(rows[-1], flush=True)
    for nbytes in sizes:
        n = nbytes // 2 // w * w
        x = torch.randn(n, device=ctx.device, generator=torch.Generator(ctx.device).manual_seed(r + 11)).to(
            torch.bfloat16)
        ref = x.float()
        dist.all_reduce(ref, group=ctx.group)
        out = torch.full_like(x, float("nan"))
        ce(x, out)
        torch.cuda.synchronize()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        hout = hout_all[:n]
        hout.fill_(float("nan"))
        ce(x, hout, sym_out=True)
        torch.cuda.synchronize()
        same_sym = bool(torch.equal(hout, out))
        dig = [None] * w
        dist.all_gather_object(dig, hashlib.sha1(out.cpu().view(torch.int16).numpy().tobytes()).hexdigest(),
                              group=ctx.cpu_group)
        o2 = torch.empty_like(x)
        nb = x.clone()
        res = {
            "ce_us": t(lambda: ce(x, out), "ce_us"),  # noqa: B023
            "ce_1stream_us": t(lambda: ce(x, out, one_stream=True), "ce_1stream_us"),  # noqa: B023
            "ce_symout_us": t(lambda: ce(x, hout, sym_out=True), "ce_symout_us"),  # noqa: B023
            "ce_rs_only_us": t(lambda: ce(x, out, phases="r"), "ce_rs_only_us"),  # noqa: B023
            "ce_reduce_only_us": t(lambda: ce(x, out, phases="a"), "ce_reduce_only_us"),  # noqa: B023
            "ce_ag_only_us": t(lambda: ce(x, out, phases="d"), "ce_ag_only_us"),  # noqa: B023
            "ours_us": t(lambda: ar(x, o2), "ours_us"),  # noqa: B023
            "ours_symout_us": t(lambda: ar(x, hout), "ours_symout_us"),  # noqa: B023
            "nccl_us": t(lambda: dist.all_reduce(nb, group=ctx.group), "nccl_us"),  # noqa: B023
        }
        m = _max_over_ranks(ctx, res)
        row = {"bytes": n * 2, "err": err, "same_bits_ranks": len(set(dig)) == 1, "same_sym": same_sym, **m}
        row["egress_GBps_rs"] = (w - 1) / w * n * 2 / (m["ce_rs_only_us"] * 1e3) if m["ce_rs_only_us"] else None
        rows.append(row)
        if r == 0:
            print(row, flush=True)

    # GEMM + AR, N-slices
    K, N = 28672 // w, 8192
    wt = torch.randn(N, K, device=ctx.device, dtype=torch.bfloat16) / K ** 0.5
    side = torch.cuda.Stream(ctx.device, priority=-1)
    evs = [torch.cuda.Event() for _ in range(16)]
    for M in gemm_ms:
        xa = torch.randn(M, K, device=ctx.device, dtype=torch.bfloat16)
        y = torch.empty(M, N, device=ctx.device, dtype=torch.bfloat16)

        def base():
            yy = torch.matmul(xa, wt.t())  # noqa: B023
            dist.all_reduce(yy, group=ctx.group)

        def gemm_only():
            torch.matmul(xa, wt.t())  # noqa: B023

        def plain_ours():
            yy = torch.matmul(xa, wt.t())  # noqa: B023
            ar(yy.view(-1), y.view(-1))  # noqa: B023

        def plain_ce():
            yy = torch.matmul(xa, wt.t())  # noqa: B023
            ce(yy.view(-1), y.view(-1))  # noqa: B023

        def sliced(k):
            def f():
                main = torch.cuda.current_stream()
                ns = N // k
                outs = []
                for j in range(k):
                    pj = torch.matmul(xa, wt[j * ns:(j + 1) * ns].t())  # noqa: B023
                    evs[j].record(main)
                    side.wait_event(evs[j])
                    with torch.cuda.stream(side):
                        oj = torch.empty_like(pj)
                        ce(pj.view(-1), oj.view(-1))
                        outs.append(oj)
                    pj.record_stream(side)
                main.wait_stream(side)
                for j in range(k):
                    y[:, j * ns:(j + 1) * ns].copy_(outs[j])  # noqa: B023
            return f

        res = {"gemm_us": t(gemm_only), "base_nccl_us": t(base), "plain_ours_us": t(plain_ours),
               "plain_ce_us": t(plain_ce)}
        for k in (2, 4):
            res[f"sliced{k}_ce_us"] = t(sliced(k))
        # correctness of sliced 2
        yref = torch.matmul(xa, wt.t())
        dist.all_reduce(yref, group=ctx.group)
        sliced(2)()
        torch.cuda.synchronize()
        gerr = ((y.float() - yref.float()).abs().max() / yref.float().abs().max()).item()
        m = _max_over_ranks(ctx, res)
        row = {"M": M, "K": K, "N": N, "gemm_err": gerr, **m}
        row["speedup_best"] = m["base_nccl_us"] / min(v for k2, v in m.items() if k2 not in ("gemm_us", "base_nccl_us")
                                                      and v)
        rows.append(row)
        if r == 0:
            print(row, flush=True)
    ar.close()
    comm.close()
    return {"world": w, "rows": rows} if r == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="1M,4M,8M,16M,32M,64M,128M")
    ap.add_argument("--gemm-m", default="512,2048,8192")
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    ms = [int(m) for m in a.gemm_m.split(",") if m]
    rep = launch(probe_rank, a.world, sizes, ms, 0, timeout=560)[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
