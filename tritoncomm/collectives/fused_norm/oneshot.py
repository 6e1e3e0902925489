"""All-reduce + residual add + RMSNorm (+ FP8 quantisation) in one kernel: the one-shot variant
(rows in chunks as ``fused_norm.rows`` describes).

The one-shot variant: program ``pid`` stages its items' chunks of ``x`` in its heap (halves
alternate by epoch parity), meets the matching programs at a barrier, then sums the ranks' staged
chunks in rank order 0..W-1 in fp32 and finishes the chunk as above.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import barrier, copy_block, epoch_commit, heap_ptr, program_epoch
from ...kernels.memory import address_ptr
from ...units import round_up
from ..base import Workspace
from .algorithm import FusedAlgorithm
from .rows import add_residual, chunk_cols, fp8_inverse_scale, load_chunk, row_rstd, store_norm, work_item

__all__ = ["FusedOneShot", "allreduce_add_rmsnorm_kernel"]


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                 bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off, slot_bytes, xch_off,
                                 sig, WORLD: tl.constexpr, CH: tl.constexpr, BLOCK_C: tl.constexpr, GEMMA: tl.constexpr,
                                 FP8: tl.constexpr, ENGINE: tl.constexpr = False, TREE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = address_ptr(diag_addr, tl.int64)
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    stage_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    iters = tl.cdiv(T * CH - pid, nprog)
    mine = heap_ptr(bases, rank, stage_off, DTYPE)
    for i in range(0, iters):  # 1. stage my items' chunks
        row, c = work_item(pid, i, nprog, CH)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        copy_block(mine + row * H, x_ptr + row * H, cols, cmask)
    if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
        iters = iters * 0  # a rank called another collective: write nothing
    for i in range(0, iters):  # 2. sum the chunks over ranks, add, normalise
        row, c = work_item(pid, i, nprog, CH)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        res = load_chunk(res_ptr, row, H, cols, cmask)
        w = load_chunk(w_ptr, 0, 0, cols, cmask)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for s in tl.static_range(WORLD):
            acc += tl.load(heap_ptr(bases, s, stage_off, DTYPE) + row * H + cols, mask=cmask,
                           other=0.0).to(tl.float32)
        resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask, ENGINE)
        rstd = row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH, TREE)
        store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA, FP8, ENGINE)
    epoch_commit(epoch_ptr, e)


class FusedOneShot(FusedAlgorithm):
    """Launcher of ``allreduce_add_rmsnorm_kernel``. Workspace: two staging halves (parities) of the
    largest input, one barrier slot per program, the row exchange."""

    name = "oneshot"
    kernel = allreduce_add_rmsnorm_kernel

    def layout(self) -> Workspace:
        self.stage_bytes = round_up(self.rows * self.plan.max_hidden * 2, 256)
        self.xch_rel = 2 * self.stage_bytes
        return Workspace(barrier_slots=self.grid, buffer_bytes=self.xch_rel + self.exchange_bytes)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        t, h = x.shape
        ch, cw = self.plan.chunks(t, h, self.grid)
        block = self._block(cw)
        c = self.channel
        self.launcher(
            *self._args(x, residual, residual_out, weight, out, scale, cw, eps), c.flags_off, c.epochs_off,
            c.buffer_off, self.stage_bytes, c.buffer_off + self.xch_rel, sig,
            **self._meta(ch, block, block, gemma, fp8, engine))
