"""Experiment: what each step of the fused LL add-RMSNorm costs at decode sizes. Not part of the library:

    PYTHONPATH=. python3 benchmarks/experiments/fused_ll_ablation.py --world 2 --json ablation.json

The library kernel (``fused_norm_ll``) rebuilt from the same helpers with switches: ``XCH`` (the
row exchange between a row's chunk programs; off: each chunk normalises by its own partial, wrong
values, same other work), ``RES`` (residual load, add and store), ``NORM`` (the sum of squares,
normalisation and weight; off: the rounded sum is stored, as the bare all-reduce does), ``EPTR``
(the epoch counter's address passed in, instead of loaded as ``bases[rank] + epochs_off``),
``TRIES`` (the receive as ``ll_sum_ranks``' rounds of looks, else one bounded poll per peer),
``XSUM`` (the exchange's partials summed from the look that saw them, else reloaded after it).
Hidden 8192, bf16, 1 and 8 tokens, CUDA graphs, max over ranks, the library's bare LL all-reduce
and fused op timed in the same run.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from tritoncomm.bench import _max_over_ranks
from tritoncomm.channels import Communicator
from tritoncomm.collectives import AllReduce, FusedAllReduceAddRMSNorm
from tritoncomm.collectives.allreduce_ll import ll_sum_ranks, load_words, words_to_f32
from tritoncomm.collectives.fused_norm import add_residual, chunk_cols, load_chunk, row_rstd, store_norm, work_item
from tritoncomm.config import CommConfig
from tritoncomm.kernels import epoch_commit, epoch_next, heap_ptr, ll8_poll, ll8_store, program_epoch, round_to
from tritoncomm.launch import launch
from tritoncomm.timing import time_per_call_us


@triton.jit(do_not_specialize=["rank"])
def ablation_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps, bases, rank, timeout,
                    diag_addr, epochs_off, buf_off, slot_words, xch_off, row_words, cww, eaddr,
                    WORLD: tl.constexpr, CH: tl.constexpr, BLOCK_C: tl.constexpr, XCH: tl.constexpr,
                    RES: tl.constexpr, NORM: tl.constexpr, EPTR: tl.constexpr, TRIES: tl.constexpr,
                    XSUM: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    BW: tl.constexpr = BLOCK_C // 2
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    if EPTR:
        epoch_ptr = eaddr.to(tl.pointer_type(tl.uint32)) + pid
        e = epoch_next(epoch_ptr)
    else:
        epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    wds = tl.arange(0, BW)
    iters = tl.cdiv(T * CH - pid, nprog)
    dst_off = buf_off + ((parity * WORLD + rank) * slot_words) * 8
    for i in range(0, iters):
        row, c = work_item(pid, i, nprog, CH)
        wmask = (wds < cww) & (c * cww + wds < row_words)
        words = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_store(heap_ptr(bases, p, dst_off, tl.uint64) + row * row_words + c * cww + wds, words, e,
                          mask=wmask)
    for i in range(0, iters):
        row, c = work_item(pid, i, nprog, CH)
        wmask = (wds < cww) & (c * cww + wds < row_words)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        if RES:
            res = load_chunk(res_ptr, row, H, cols, cmask)
        if NORM:
            w = load_chunk(w_ptr, 0, 0, cols, cmask)
        if TRIES:
            own = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
            acc = ll_sum_ranks(own, row * row_words + c * cww + wds, wmask, bases, rank, buf_off, parity,
                               slot_words, e, row, timeout, diag, WORLD, BW, DTYPE)
        else:
            acc = tl.zeros([BLOCK_C], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    words = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
                else:
                    src = heap_ptr(bases, rank, buf_off + ((parity * WORLD + s) * slot_words) * 8, tl.uint64)
                    words = ll8_poll(src + row * row_words + c * cww + wds, wmask, e, s, row, rank, timeout, diag)
                acc += words_to_f32(words, DTYPE, BW)
        if RES:
            resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask)
        else:
            resid = round_to(acc, DTYPE)
        if NORM:
            if XCH and XSUM:
                rstd = row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH)
            elif XCH:  # the exchange as before session 8: poll, then reload the partials and sum
                v = resid.to(tl.float32)
                slots = heap_ptr(bases, rank, xch_off, tl.uint64) + row * CH
                ll8_store(slots + c, tl.sum(v * v, axis=0).to(tl.uint32, bitcast=True), e)
                k = tl.arange(0, CH)
                pw = ll8_poll(slots + k, k < CH, e, rank, row, rank, timeout, diag)
                rstd = 1.0 / tl.sqrt(tl.sum(pw.to(tl.float32, bitcast=True), axis=0) / H + eps)
            else:
                v = resid.to(tl.float32)
                rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) * CH / H + eps)
            store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, scale_ptr, False, False)
        else:
            tl.store(out_ptr + row * H + cols, resid, mask=cmask)
    epoch_commit(epoch_ptr, e)


def ablation_rank(ctx) -> dict | None:
    dev, h = ctx.device, 8192
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=256 << 20, timeout_s=60))
    ar = AllReduce(comm, max_bytes=8 * h * 2, algos=("ll",), name="ab.ar")
    f = FusedAllReduceAddRMSNorm(comm, 8, h, algos=("ll",), name="ab.f")
    ch = f._channels["ll"]
    bases, rank, world, timeout, diag = comm.kernel_args()
    eaddr = comm.heap.peer_addr(rank, ch.epochs)
    w = torch.rand(h, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).to(torch.bfloat16) + 0.5
    # (XCH, RES, NORM, EPTR, TRIES, XSUM); "before": the kernel as it was at the start of session 8
    knobs = {"before": (1, 1, 1, 0, 0, 0), "before + tries": (1, 1, 1, 0, 1, 0),
             "before + poll-sum exchange": (1, 1, 1, 0, 0, 1), "new (tries + poll-sum)": (1, 1, 1, 0, 1, 1),
             "new + epoch ptr": (1, 1, 1, 1, 1, 1), "new, no xch": (0, 1, 1, 0, 1, 1),
             "new, no xch, no res, no norm": (0, 0, 0, 0, 1, 1)}
    results: dict[str, float] = {}
    for t in (1, 8):
        g = torch.Generator(device=dev).manual_seed(t + rank)
        x = torch.randn(t, h, device=dev, generator=g).to(torch.bfloat16)
        res = torch.randn(t, h, device=dev, generator=torch.Generator(device=dev).manual_seed(t)).to(torch.bfloat16)
        out, xo = torch.empty_like(x), torch.empty_like(x)
        cch, cw = f.chunks(t, h, f._grids["ll"])
        block = triton.next_power_of_2(cw)
        results[f"{t} tok: bare LL all-reduce"] = time_per_call_us(lambda x=x, xo=xo: ar(x, out=xo, algo="ll"), dev,
                                                                   ctx.barrier)
        results[f"{t} tok: library fused LL (CH={cch})"] = time_per_call_us(
            lambda x=x, res=res, out=out: f(x, res, w, out=out, algo="ll"), dev, ctx.barrier)
        for name, (xch, rs, nrm, eptr, tries, xsum) in knobs.items():
            def run(t=t, x=x, res=res, out=out, cch=cch, cw=cw, block=block, xch=xch, rs=rs, nrm=nrm, eptr=eptr,
                    tries=tries, xsum=xsum):
                ablation_kernel[(f._grids["ll"],)](
                    x, res, res, w, out, w, t, h, cw, f.eps, bases, rank, timeout, diag, ch.epochs_off,
                    ch.buffer_off, f._ll_slot_words, ch.buffer_off + f._xch["ll"], (h + 1) // 2, cw // 2, eaddr,
                    WORLD=world, CH=cch, BLOCK_C=block, XCH=xch, RES=rs, NORM=nrm, EPTR=eptr, TRIES=tries, XSUM=xsum,
                    num_warps=8 if block >= 4096 else 4)
            results[f"{t} tok: {name}"] = time_per_call_us(run, dev, ctx.barrier)
    m = _max_over_ranks(ctx, results)
    if rank == 0:
        for k, v in m.items():
            print(f"{k:48s} {v:7.2f}", flush=True)
    f.close()
    ar.close()
    comm.close()
    return {"device": torch.cuda.get_device_name(dev), "world": world, "us": m} if rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = launch(ablation_rank, a.world, backend="cuda")[0]
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
