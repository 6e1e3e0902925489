"""Pipelined two-shot all-reduce: the two-shot of ``allreduce.twoshot`` with a barrier per block
instead of per program, skewed so that NVLink traffic never waits for local work.

Each program walks its blocks ``b = pid, pid + P, ...`` (a block is ``BLOCK`` elements of every
shard). Iteration ``i`` does three stages on three different blocks:

* A: push block ``i`` of every shard to its owner (``rs`` slot [my rank]), then
  ``barrier_arrive`` on flag row (0, b): this rank's part of block b is out;
* B: ``barrier_wait`` on row (0, block i-1); sum that block of my shard over ranks 0..W-1 in order;
  write it out, push it to every peer (``ag`` slot [my rank]); ``barrier_arrive`` on row (1, i-1);
* C: ``barrier_wait`` on row (1, block i-2); copy the other shards' block from ``ag`` to the output.

The stores of stage A are in flight while stages B and C of older blocks run, so the links stay
busy. Buffers need no second copy by parity (the argument of ``allreduce.twoshot`` holds per block):
a rank pushes into a peer's ``rs``/``ag`` for launch k+1 only after a row that the peer arrives at
in launch k+1, i.e. after the peer has finished launch k. Flag rows: 2 x (blocks per shard).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...kernels import assume_multiple, barrier_arrive, barrier_wait, epoch_commit, pow2_divisor, program_epoch
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm
from .twoshot import twoshot_gather_block, twoshot_reduce_block, twoshot_scatter_block

__all__ = ["PIPE_MIN_BLOCK", "Pipelined", "pipelined_allreduce_kernel"]


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


#: The pipelined two-shot keeps one flag row per block; blocks are at least this many elements.
PIPE_MIN_BLOCK = 1024


class Pipelined(AllReduceAlgorithm):
    """Launcher of ``pipelined_allreduce_kernel``. Never won a measurement on H200 (``docs/algorithms.md``),
    so ``tune`` does not try it on GPUs; it stays selectable by name. Workspace: as the two-shot's, plus two flag rows
    per block of the largest shard."""

    name = "pipelined"
    kernel = pipelined_allreduce_kernel
    shapes = MappingProxyType({"cuda": (64, 8192, 8), "cpu": (2, 1024, 1)})

    def layout(self) -> Workspace:
        self.shard_cap = round_up(cdiv(self.capacity, self.world) + 128, 256)
        self.rows = cdiv(self.shard_cap, 2 * PIPE_MIN_BLOCK)  # blocks per shard, at most
        return Workspace(barrier_slots=2 * self.rows, buffer_bytes=2 * self.world * self.shard_cap)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        return [] if backend == "cuda" else [Choice("pipelined", 2, 1024, 1)]

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n = x.numel()
        self.launcher(
            x, out, n, round_up(cdiv(n, world), 16), bases, rank, timeout, diag, ch.flags_off, ch.epochs_off,
            ch.buffer_off, ch.buffer_off + world * self.shard_cap, self.rows, c.programs, WORLD=world,
            BLOCK=max(c.block, PIPE_MIN_BLOCK), NDIV=pow2_divisor(n), num_warps=c.num_warps)
