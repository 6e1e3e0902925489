"""Pipelined two-shot all-reduce: the two-shot of ``allreduce_twoshot`` with a barrier per block
instead of per program, skewed so that NVLink traffic never waits for local work.

Each program walks its blocks ``b = pid, pid + P, ...`` (a block is ``BLOCK`` elements of every
shard). Iteration ``i`` does three stages on three different blocks:

* A: push block ``i`` of every shard to its owner (``rs`` slot [my rank]), then
  ``barrier_arrive`` on flag row (0, b): this rank's part of block b is out;
* B: ``barrier_wait`` on row (0, block i-1); sum that block of my shard over ranks 0..W-1 in order;
  write it out, push it to every peer (``ag`` slot [my rank]); ``barrier_arrive`` on row (1, i-1);
* C: ``barrier_wait`` on row (1, block i-2); copy the other shards' block from ``ag`` to the output.

The stores of stage A are in flight while stages B and C of older blocks run, so the links stay
busy. Buffers need no second copy by parity (the argument of ``allreduce_twoshot`` holds per block):
a rank pushes into a peer's ``rs``/``ag`` for launch k+1 only after a row that the peer arrives at
in launch k+1, i.e. after the peer has finished launch k. Flag rows: 2 x (blocks per shard).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import assume_multiple, barrier_arrive, barrier_wait, epoch_commit, program_epoch
from .allreduce_twoshot import twoshot_gather_block, twoshot_reduce_block, twoshot_scatter_block

__all__ = ["pipelined_allreduce_kernel"]


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def pipelined_allreduce_kernel(x_ptr, out_ptr, n, shard, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                               rs_off, ag_off, row1, active, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                               NDIV: tl.constexpr = 1):
    """Sum ``n`` elements over the ranks into ``out_ptr`` (may equal ``x_ptr``); ``shard`` elements
    per rank (a multiple of 16); flag rows ``b`` (phase 0) and ``row1 + b`` (phase 1)."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(shard, BLOCK) - pid, active)
        for i in range(0, iters + 2):
            if i < iters:  # A: reduce-scatter push of block i
                b = pid + i * active
                twoshot_scatter_block(x_ptr, n, shard, b, bases, rank, rs_off, WORLD, BLOCK)
                barrier_arrive(bases, rank, WORLD, flags_off, b, e)
            if i >= 1 and i <= iters:  # B: reduce block i-1, push the result
                b = pid + (i - 1) * active
                barrier_wait(bases, rank, WORLD, flags_off, b, e, timeout, diag)
                twoshot_reduce_block(x_ptr, out_ptr, n, shard, b, bases, rank, rs_off, ag_off, WORLD, BLOCK)
                barrier_arrive(bases, rank, WORLD, flags_off, row1 + b, e)
            if i >= 2:  # C: gather block i-2
                b = pid + (i - 2) * active
                barrier_wait(bases, rank, WORLD, flags_off, row1 + b, e, timeout, diag)
                twoshot_gather_block(out_ptr, n, shard, b, bases, rank, ag_off, WORLD, BLOCK)
    epoch_commit(epoch_ptr, e)
