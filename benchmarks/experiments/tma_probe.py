"""Experiment: do TMA bulk stores (``cp.async.bulk.tensor``, Triton tensor descriptors) push more
bytes per second over NVLink than SM vector stores (``st.global.v4``)? Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/tma_probe.py --world 2 --json tma.json

Every rank pushes ``S`` bytes into the next rank's heap at the same time (as an all-reduce's push
phases do), CUDA graphs (``time_per_call_us``), max over ranks; then the receiver checks the bytes.
Variants: SM stores (grid x block x warps), TMA stores through a device-side descriptor over the
peer's buffer seen as ``(rows, 256)`` bf16 (grid x box rows), a copy-engine copy; and pulls
(SM loads vs TMA loads of the peer's buffer into local memory). Also rank 0 alone (one direction).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.config import CommConfig
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us

COLS = 256  # TMA box dims are at most 256 elements


@triton.jit
def sm_push(src, bases, peer, dst_off, n, BLOCK: tl.constexpr):
    dst = tl.multiple_of((tl.load(bases + peer) + dst_off).to(tl.pointer_type(tl.bfloat16)), 16)
    for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs))


@triton.jit
def tma_push(src, bases, peer, dst_off, rows, BR: tl.constexpr, C: tl.constexpr):
    dst = tl.multiple_of((tl.load(bases + peer) + dst_off).to(tl.pointer_type(tl.bfloat16)), 16)
    desc = tl.make_tensor_descriptor(dst, shape=[rows, C], strides=[C, 1], block_shape=[BR, C])
    for b in range(tl.program_id(0), tl.cdiv(rows, BR), tl.num_programs(0)):
        r = b * BR + tl.arange(0, BR)
        v = tl.load(src + r[:, None] * C + tl.arange(0, C)[None, :])
        desc.store([b * BR, 0], v)


@triton.jit
def tma_copy(src, bases, peer, dst_off, rows, BR: tl.constexpr, C: tl.constexpr):
    """TMA load of my block into shared memory, TMA store of it to the peer (no registers)."""
    dst = tl.multiple_of((tl.load(bases + peer) + dst_off).to(tl.pointer_type(tl.bfloat16)), 16)
    sdesc = tl.make_tensor_descriptor(src, shape=[rows, C], strides=[C, 1], block_shape=[BR, C])
    ddesc = tl.make_tensor_descriptor(dst, shape=[rows, C], strides=[C, 1], block_shape=[BR, C])
    for b in range(tl.program_id(0), tl.cdiv(rows, BR), tl.num_programs(0)):
        ddesc.store([b * BR, 0], sdesc.load([b * BR, 0]))


@triton.jit
def sm_pull(dst, bases, peer, src_off, n, BLOCK: tl.constexpr):
    src = tl.multiple_of((tl.load(bases + peer) + src_off).to(tl.pointer_type(tl.bfloat16)), 16)
    for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs))


@triton.jit
def tma_pull(dst, bases, peer, src_off, rows, BR: tl.constexpr, C: tl.constexpr):
    src = tl.multiple_of((tl.load(bases + peer) + src_off).to(tl.pointer_type(tl.bfloat16)), 16)
    desc = tl.make_tensor_descriptor(src, shape=[rows, C], strides=[C, 1], block_shape=[BR, C])
    for b in range(tl.program_id(0), tl.cdiv(rows, BR), tl.num_programs(0)):
        r = b * BR + tl.arange(0, BR)
        tl.store(dst + r[:, None] * C + tl.arange(0, C)[None, :], desc.load([b * BR, 0]))


def probe_rank(ctx, size: int) -> dict | None:
    triton.set_allocator(lambda nbytes, align, stream: torch.empty(nbytes, dtype=torch.int8, device=ctx.device))
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=2 * size + (64 << 20), timeout_s=60))
    r, w = comm.rank, comm.world
    peer, prev = (r + 1) % w, (r - 1) % w
    inbox = comm.heap.alloc(size, "probe.inbox")
    mine = comm.heap.alloc(size, "probe.src")  # what peers pull from
    comm.heap.verify()
    n = size // 2
    rows = n // COLS
    g = torch.Generator(device=ctx.device).manual_seed(1234 + r)
    src = torch.randint(-30000, 30000, (n,), dtype=torch.int16, device=ctx.device, generator=g).view(torch.bfloat16)
    comm.heap.view(mine, torch.bfloat16).copy_(src)
    pulled = torch.empty_like(src)
    bases = comm.heap.bases
    expect_from_prev = torch.randint(-30000, 30000, (n,), dtype=torch.int16, device=ctx.device,
                                     generator=torch.Generator(device=ctx.device).manual_seed(1234 + prev))
    expect_from_peer = torch.randint(-30000, 30000, (n,), dtype=torch.int16, device=ctx.device,
                                     generator=torch.Generator(device=ctx.device).manual_seed(1234 + peer))
    torch.cuda.synchronize()
    comm.bootstrap.barrier()
    peer_view = comm.heap.peer_view(peer, inbox, torch.bfloat16)
    variants: dict[str, callable] = {}
    for grid in (66, 132, 264):
        for block, warps in ((4096, 4), (8192, 8), (16384, 16)):
            variants[f"sm_push g{grid} b{block} w{warps}"] = (
                lambda grid=grid, block=block, warps=warps: sm_push[(grid,)](
                    src, bases, peer, inbox.offset, n, BLOCK=block, num_warps=warps))
    for grid in (32, 66, 132):
        for br, warps in ((16, 4), (32, 4), (64, 8)):
            variants[f"tma_push g{grid} r{br} w{warps}"] = (
                lambda grid=grid, br=br, warps=warps: tma_push[(grid,)](
                    src, bases, peer, inbox.offset, rows, BR=br, C=COLS, num_warps=warps))
            variants[f"tma_copy g{grid} r{br} w{warps}"] = (
                lambda grid=grid, br=br, warps=warps: tma_copy[(grid,)](
                    src, bases, peer, inbox.offset, rows, BR=br, C=COLS, num_warps=warps))
    variants["copy_engine"] = lambda: peer_view.copy_(src)
    pulls: dict[str, callable] = {}
    for grid in (66, 132, 264):
        pulls[f"sm_pull g{grid} b8192 w8"] = (lambda grid=grid: sm_pull[(grid,)](
            pulled, bases, peer, mine.offset, n, BLOCK=8192, num_warps=8))
    for grid in (66, 132):
        for br in (16, 32, 64):
            pulls[f"tma_pull g{grid} r{br}"] = (lambda grid=grid, br=br: tma_pull[(grid,)](
                pulled, bases, peer, mine.offset, rows, BR=br, C=COLS, num_warps=4))
    inbox_view = comm.heap.view(inbox, torch.int16)
    out = {}
    for name, fn in list(variants.items()) + list(pulls.items()):
        inbox_view.fill_(7)
        pulled.fill_(7)
        torch.cuda.synchronize()
        comm.bootstrap.barrier()
        err = None
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # a variant that does not compile or launch is reported, not fatal
            err = f"{type(exc).__name__}: {str(exc)[:200]}"
        comm.bootstrap.barrier()
        if err is None:
            ok = bool(torch.equal(pulled.view(torch.int16), expect_from_peer)) if name in pulls else \
                bool(torch.equal(inbox_view, expect_from_prev))
            us = time_per_call_us(fn, ctx.device, comm.bootstrap.barrier, calls=8, replays=10)
        else:
            ok, us = False, float("nan")
        m = _max_over_ranks(ctx, {"us": us})["us"]
        oks = [None] * w
        dist.all_gather_object(oks, (ok, err), group=ctx.cpu_group)
        out[name] = {"us": m, "GBps": size / (m * 1e3) if m else None, "ok": all(o for o, _ in oks),
                     "err": next((e for _, e in oks if e), None)}
        if r == 0:
            print(f"{name:32s} {m if m else float('nan'):9.1f} us {out[name]['GBps'] or 0:7.1f} GB/s "
                  f"ok={out[name]['ok']} {out[name]['err'] or ''}", flush=True)
    # one direction: rank 0 pushes, the others idle (the best of each kind above)
    uni = {}
    for kind in ("sm_push", "tma_push", "tma_copy", "copy_engine"):
        cands = [(v["us"], k) for k, v in out.items() if k.startswith(kind) and v["ok"] and v["us"]]
        if not cands:
            continue
        best = min(cands)[1]
        fn = variants[best]
        idle = lambda: pulled[:1].zero_()  # noqa: E731  (the other ranks time a trivial kernel)
        us = time_per_call_us(fn if r == 0 else idle, ctx.device, comm.bootstrap.barrier, calls=8, replays=10)
        m = us if r == 0 else None
        got = [None] * w
        dist.all_gather_object(got, m, group=ctx.cpu_group)
        uni[best] = {"us": got[0], "GBps": size / (got[0] * 1e3)}
        if r == 0:
            print(f"one direction {best:32s} {got[0]:9.1f} us {uni[best]['GBps']:7.1f} GB/s", flush=True)
    del inbox_view
    comm.synchronize()
    comm.close()
    if r != 0:
        return None
    return {"device": torch.cuda.get_device_name(ctx.device), "world": w, "bytes": size,
            "torch": torch.__version__, "triton": triton.__version__, "both_directions": out, "one_direction": uni}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = launch(probe_rank, a.world, a.size_mb << 20, backend="cuda")[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
