"""One-shot all-reduce through staged buffers and a barrier.

Each rank copies its input into a staging buffer in its own heap (``put``), meets its peers at a
barrier, then reads every rank's staging buffer (``get``-style loads over NVLink) and sums. The
barrier's release/acquire makes the staged data visible; staging alternates by epoch parity so the
next launch never overwrites a buffer that a slower peer is still reading (see ``allreduce_ll``).

Program ``pid`` stages, waits for and reads only blocks ``pid, pid + P, ...`` on every rank, so
the barrier is between matching programs only. Programs ``>= active`` skip the work and the
barrier but still advance their epoch, so every program's epoch counts launches. The sum runs in
fp32 over ranks 0..W-1 in order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import assume_multiple, barrier, copy_block, epoch_commit, heap_ptr, program_epoch, round_to

__all__ = ["oneshot_allreduce_kernel"]


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def oneshot_allreduce_kernel(x_ptr, out_ptr, n, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                             buf_off, slot_bytes, active, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                             NDIV: tl.constexpr = 1):
    """Sum ``n`` elements of ``x_ptr`` over the ranks into ``out_ptr`` (may equal ``x_ptr``).
    Programs ``>= active`` only keep their epoch in step with the others."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    nprog = active
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    stage_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    if pid < nprog:
        iters = tl.cdiv(tl.cdiv(n, BLOCK) - pid, nprog)
        mine = heap_ptr(bases, rank, stage_off, DTYPE)
        for i in range(0, iters):
            offs = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
            copy_block(mine, x_ptr, offs, offs < n)
        barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
        for i in range(0, iters):
            offs = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                acc += tl.load(heap_ptr(bases, s, stage_off, DTYPE) + offs, mask=mask).to(tl.float32)
            tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=mask)
    epoch_commit(epoch_ptr, e)
