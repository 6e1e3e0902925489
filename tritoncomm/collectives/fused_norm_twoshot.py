"""All-reduce + residual add + RMSNorm as a two-shot: the large-message variant (prefill).

Rows are cut into ``W`` shards of ``R = ceil(T / W)`` rows; rank ``s`` owns shard ``s``.

1. Every rank pushes its rows of shard ``s`` to rank ``s`` (slot [my rank] of its ``rs`` buffer).
2. Barrier between matching programs.
3. The owner sums each of its rows over ranks 0..W-1 in fp32, adds the residual, rounds once,
   stores the new residual and its normalised row, and pushes the new residual row to every peer
   (slot [my rank] of their ``ag`` buffer). Every rank holds the same residual on entry (as in a
   tensor-parallel model), so the owner's row is every rank's row.
4. Second barrier; every rank copies the other shards' new residual rows and normalises them
   itself: the same bits in, the same code, the same bits out on every rank.

Program ``pid`` handles rows ``pid, pid + P, ...`` of every shard. As in ``allreduce_twoshot``, no
buffer needs a parity copy. Over NVLink this moves what the bare two-shot moves; the extra work is
local (read the residual, write it and the output).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import barrier, copy_block, epoch_commit, heap_ptr, program_epoch
from .fused_norm import add_norm_row, load_weight, norm_row

__all__ = ["twoshot_allreduce_add_rmsnorm_kernel"]


@triton.jit
def twoshot_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, eps,
                                         bases, rank, timeout, diag_addr, flags_off, epochs_off, rs_off, ag_off,
                                         slot_bytes, WORLD: tl.constexpr, BLOCK_H: tl.constexpr, GEMMA: tl.constexpr,
                                         FP8: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    R = tl.cdiv(T, WORLD)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    iters = tl.cdiv(R - pid, nprog)
    for i in range(0, iters):  # 1. reduce-scatter push, by rows
        r = (pid + i * nprog).to(tl.int64)
        for s in tl.static_range(WORLD):
            if s != rank:
                row = s * R + r
                dst = heap_ptr(bases, s, rs_off + rank * slot_bytes, DTYPE) + r * H
                copy_block(dst, x_ptr + row * H, cols, cmask & (row < T))
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    w = load_weight(w_ptr, cols, cmask, GEMMA)
    for i in range(0, iters):  # 2. my rows: reduce, add, normalise; push the new residual
        r = (pid + i * nprog).to(tl.int64)
        row = rank * R + r
        m = cmask & (row < T)
        if row < T:
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    acc += tl.load(x_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
                else:
                    src = heap_ptr(bases, rank, rs_off + s * slot_bytes, DTYPE) + r * H
                    acc += tl.load(src + cols, mask=m, other=0.0).to(tl.float32)
            resid = add_norm_row(acc, res_ptr, res_out_ptr, row, H, cols, m, w, out_ptr, scale_ptr, eps, FP8)
            for s in tl.static_range(WORLD):
                if s != rank:
                    tl.store(heap_ptr(bases, s, ag_off + rank * slot_bytes, DTYPE) + r * H + cols, resid, mask=m)
    barrier(bases, rank, WORLD, flags_off, pid + nprog, e, timeout, diag)
    for i in range(0, iters):  # 3. the other shards' rows: take the new residual, normalise
        r = (pid + i * nprog).to(tl.int64)
        for s in tl.static_range(WORLD):
            if s != rank:
                row = s * R + r
                m = cmask & (row < T)
                if row < T:
                    resid = tl.load(heap_ptr(bases, rank, ag_off + s * slot_bytes, DTYPE) + r * H + cols, mask=m)
                    tl.store(res_out_ptr + row * H + cols, resid, mask=m)
                    norm_row(resid, row, H, cols, m, w, out_ptr, scale_ptr, eps, FP8)
    epoch_commit(epoch_ptr, e)
