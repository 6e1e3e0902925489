"""One-shot all-reduce through staged buffers and a barrier.

Each rank copies its input into a staging buffer in its own heap (``put``), meets its peers at a
barrier, then reads every rank's staging buffer (``get``-style loads over NVLink) and sums. The
barrier's release/acquire makes the staged data visible; staging alternates by epoch parity so the
next launch never overwrites a buffer that a slower peer is still reading (see ``allreduce.ll``).

Program ``pid`` stages, waits for and reads only blocks ``pid, pid + P, ...`` on every rank, so
the barrier is between matching programs only. Programs ``>= active`` skip the work and the
barrier but still advance their epoch, so every program's epoch counts launches. The sum runs in
fp32 over ranks 0..W-1 in order.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...kernels import (
    assume_multiple,
    barrier,
    copy_block,
    epoch_commit,
    heap_ptr,
    pow2_divisor,
    program_epoch,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm

__all__ = ["OneShot", "oneshot_allreduce_kernel"]


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def oneshot_allreduce_kernel(x_ptr, out_ptr, n, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                             buf_off, slot_bytes, active, sig, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                             NDIV: tl.constexpr = 1):
    """Sum ``n`` elements of ``x_ptr`` over the ranks into ``out_ptr`` (may equal ``x_ptr``).
    Programs ``>= active`` only keep their epoch in step with the others. ``sig``: the call's
    signature, compared at the barrier; where a rank's differs nothing is written."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    nprog = active
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    stage_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    if pid < nprog:
        iters = tl.cdiv(tl.cdiv(n, BLOCK) - pid, nprog)
        mine = heap_ptr(bases, rank, stage_off, DTYPE)
        for i in range(0, iters):
            offs = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
            copy_block(mine, x_ptr, offs, offs < n)
        if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
            iters = iters * 0  # a rank called another collective: write nothing
        for i in range(0, iters):
            offs = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                acc += tl.load(heap_ptr(bases, s, stage_off, DTYPE) + offs, mask=mask).to(tl.float32)
            tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=mask)
    epoch_commit(epoch_ptr, e)


class OneShot(AllReduceAlgorithm):
    """Launcher of ``oneshot_allreduce_kernel``. Workspace: two staging buffers (parities) of the
    capacity, one barrier slot per program."""

    name = "oneshot"
    kernel = oneshot_allreduce_kernel
    shapes = MappingProxyType({"cuda": (32, 4096, 8), "cpu": (2, 2048, 1)})

    def layout(self) -> Workspace:
        self.stage_bytes = round_up(self.capacity, 256)
        return Workspace(barrier_slots=self.grid, buffer_bytes=2 * self.stage_bytes)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice("oneshot", 2, 2048, 1)]
        if nbytes > 32 << 20:
            return []
        return [Choice("oneshot", min(progs, max(1, nbytes // 2 // block)), block, 8)
                for block in (2048, 8192) for progs in (8, 32, 64)]

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n = x.numel()
        self.launcher(
            x, out, n, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off, self.stage_bytes,
            c.programs, sig, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(n), num_warps=c.num_warps)
