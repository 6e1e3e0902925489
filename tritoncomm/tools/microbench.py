"""Primitive microbenchmarks between ranks 0 and 1: how close the primitives come to the link.

* put / get bandwidth by size (a grid of programs, each copying a slice with ``put``/``get``),
  next to a copy-engine copy into the same peer memory (``peer_view(...).copy_``) timed in the
  same run;
* signal -> wait round trip (ping-pong of ``signal``/``wait`` inside one kernel);
* LL packet goodput: both ranks exchange ``n`` data words as LL8 packets (payload bytes per second
  per direction).
Graph mode, median per rank, max over ranks (ping-pong: one launch of many rounds).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from ..channels import Channel, Communicator
from ..config import CommConfig
from ..kernels import epoch_commit, epoch_next, get, heap_ptr, ll8_poll, ll8_store, put, signal, wait
from ..kernels.memory import address_ptr
from ..launch import RankContext
from .timing import time_per_call_us

__all__ = ["format_micro", "micro_rank"]


@triton.jit
def _put_kernel(src, bases, peer, dst_off, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    chunk = tl.cdiv(tl.cdiv(n, tl.num_programs(0)), BLOCK) * BLOCK
    start = pid * chunk
    put(heap_ptr(bases, peer, dst_off, tl.uint8) + start, src + start, tl.minimum(chunk, n - start), BLOCK)


@triton.jit
def _get_kernel(dst, bases, peer, src_off, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    chunk = tl.cdiv(tl.cdiv(n, tl.num_programs(0)), BLOCK) * BLOCK
    start = pid * chunk
    get(dst + start, heap_ptr(bases, peer, src_off, tl.uint8) + start, tl.minimum(chunk, n - start), BLOCK)


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def _pingpong_kernel(bases, rank, flags_off, epochs_off, rounds, timeout, diag_addr):
    diag = address_ptr(diag_addr, tl.int64)
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    e = epoch_next(ep)
    base = (e - 1) * rounds
    peer = 1 - rank
    mine = heap_ptr(bases, rank, flags_off, tl.uint32)
    theirs = heap_ptr(bases, peer, flags_off, tl.uint32)
    for k in range(1, rounds + 1):
        if rank == 0:
            signal(theirs, base + k)
            wait(mine, base + k, peer, 0, rank, timeout, diag)
        else:
            wait(mine, base + k, peer, 0, rank, timeout, diag)
            signal(theirs, base + k)
    epoch_commit(ep, e)


@triton.jit(do_not_specialize=["rank"])
def _ll_exchange_kernel(out_bad, bases, rank, epochs_off, buf_off, slot_words, nwords, timeout, diag_addr,
                        BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    diag = address_ptr(diag_addr, tl.int64)
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32) + pid
    e = epoch_next(ep)
    parity = (e & 1).to(tl.int64)
    peer = 1 - rank
    iters = tl.cdiv(tl.cdiv(nwords, BLOCK) - pid, nprog)
    for i in range(0, iters):
        w = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
        dst = heap_ptr(bases, peer, buf_off + (parity * 2 + rank) * slot_words * 8, tl.uint64)
        ll8_store(dst + w, w.to(tl.uint32) ^ e, e, mask=w < nwords)
    bad = 0
    for i in range(0, iters):
        w = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
        src = heap_ptr(bases, rank, buf_off + (parity * 2 + peer) * slot_words * 8, tl.uint64)
        got = ll8_poll(src + w, w < nwords, e, peer, 0, rank, timeout, diag)
        bad += tl.sum(((got != (w.to(tl.uint32) ^ e)) & (w < nwords)).to(tl.int32), axis=0)
    tl.atomic_add(out_bad, bad)
    epoch_commit(ep, e)


def micro_rank(ctx: RankContext, sizes: list[int] | None = None) -> dict[str, Any] | None:
    cuda = ctx.backend == "cuda"
    sizes = sizes or ([1 << k for k in range(12, 29, 2)] if cuda else [4096, 65536])
    big = max(sizes)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=big + (48 << 20), timeout_s=60))
    active = ctx.rank < 2
    ch = Channel(comm, "micro", programs=64, barrier_slots=1, buffer_bytes=big)
    bases, rank, world, timeout, diag = comm.kernel_args()
    peer = 1 - rank if active else rank
    programs = 64 if cuda else 2
    block = 8192 if cuda else 4096

    pair = dist.new_group([0, 1], backend="gloo")  # collective over all ranks; only 0 and 1 use it

    def pair_barrier() -> None:
        dist.barrier(group=pair)

    def timed(fn, barrier=lambda: None) -> float:
        return time_per_call_us(fn, ctx.device, barrier, replays=10)

    rows = []
    src = torch.randint(0, 255, (big,), dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    for n in sizes:
        t: dict[str, float] = {}
        if rank == 0:
            view = comm.heap.peer_view(peer, ch.buffer)[:n]
            t["put"] = timed(lambda n=n: _put_kernel[(programs,)](src, bases, peer, ch.buffer_off, n, BLOCK=block))
            t["get"] = timed(lambda n=n: _get_kernel[(programs,)](dst, bases, peer, ch.buffer_off, n, BLOCK=block))
            t["copy_engine"] = timed(lambda n=n, view=view: view.copy_(src[:n]))
            del view
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, t, group=ctx.cpu_group)
        t = gathered[0]
        rows.append({"bytes": n, **{f"{k}_us": v for k, v in t.items()},
                     **{f"{k}_GBps": n / (v * 1e3) for k, v in t.items()}})
    comm.synchronize()
    # signal -> wait ping-pong
    rounds = 2000 if cuda else 50
    pp = None
    if cuda:
        for _ in range(2):  # warm-up + measured
            if active:
                pair_barrier()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _pingpong_kernel[(1,)](bases, rank, ch.flags_off, ch.epochs_off, rounds, timeout, diag)
                end.record()
                end.synchronize()
                pp = start.elapsed_time(end) * 1e3 / rounds
    else:
        import time

        if active:
            pair_barrier()
            t0 = time.perf_counter()
            _pingpong_kernel[(1,)](bases, rank, ch.flags_off, ch.epochs_off, rounds, timeout, diag)
            pp = (time.perf_counter() - t0) * 1e6 / rounds
    comm.synchronize()
    # LL goodput
    ll = []
    slot_words = 1 << 20
    bad = torch.zeros(1, dtype=torch.int32, device=ctx.device)
    ll_ch = Channel(comm, "micro.ll", programs=programs, buffer_bytes=4 * slot_words * 8)
    for nbytes in ([1 << k for k in range(10, 23, 2)] if cuda else [4096]):
        nwords = nbytes // 4
        if active:
            us = timed(lambda nwords=nwords: _ll_exchange_kernel[(programs,)](
                bad, bases, rank, ll_ch.epochs_off, ll_ch.buffer_off, slot_words, nwords, timeout, diag,
                BLOCK=1024, num_warps=4), pair_barrier)
        else:
            us = 0.0
        gathered = [None] * world
        dist.all_gather_object(gathered, us, group=ctx.cpu_group)
        us = max(gathered[:2])
        ll.append({"bytes": nbytes, "us": us, "goodput_GBps": nbytes / (us * 1e3)})
    comm.synchronize()
    ll_ok = int(bad.item()) == 0
    ll_ch.close()
    ch.close()
    comm.close()
    if rank != 0:
        return None
    return {"op": "primitives", "device": torch.cuda.get_device_name(ctx.device) if cuda else "CPU world",
            "date": datetime.date.today().isoformat(), "world": world, "bandwidth": rows,
            "pingpong_round_trip_us": pp, "ll": ll, "ll_data_ok": ll_ok,
            "method": "graph mode per call (32 calls, median of 10 replays); ping-pong: one launch of "
                      f"{rounds} rounds, rank 0's time per round"}


def format_micro(rep: dict[str, Any]) -> str:
    lines = [f"primitives: device={rep['device']} date={rep['date']}; {rep['method']}",
             f"{'bytes':>10} {'put GB/s':>9} {'get GB/s':>9} {'copy-engine GB/s':>17}"]
    for r in rep["bandwidth"]:
        lines.append(f"{r['bytes']:>10} {r['put_GBps']:9.1f} {r['get_GBps']:9.1f} {r['copy_engine_GBps']:17.1f}")
    lines.append(f"signal->wait round trip: {rep['pingpong_round_trip_us']:.2f} us "
                 f"(one way {rep['pingpong_round_trip_us'] / 2:.2f} us)")
    lines.append(f"{'LL bytes':>10} {'us':>8} {'goodput GB/s':>13}   (data verified: {rep['ll_data_ok']})")
    for r in rep["ll"]:
        lines.append(f"{r['bytes']:>10} {r['us']:8.2f} {r['goodput_GBps']:13.2f}")
    return "\n".join(lines)
