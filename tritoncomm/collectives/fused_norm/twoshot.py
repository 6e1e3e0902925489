"""All-reduce + residual add + RMSNorm as a two-shot: the large-message variant (prefill).

Rows are cut into ``W`` shards of ``R = ceil(T / W)`` rows; rank ``s`` owns shard ``s``. Work items
are (row of a shard, chunk) pairs as in ``fused_norm.rows``.

1. Every rank pushes its chunks of shard ``s`` rows to rank ``s`` (slot [my rank] of its ``rs``
   buffer).
2. Barrier between matching programs.
3. The owner sums each chunk of its rows over ranks 0..W-1 in fp32, adds the residual, rounds once,
   stores the new residual, gets the row's ``rstd`` (chunks exchange partial sums), stores its
   normalised chunk, and pushes the new residual chunk and the row's ``rstd`` to every peer (slot
   [my rank] of their ``ag`` and ``rstd`` buffers). Every rank holds the same residual on entry
   (as in a tensor-parallel model), so the owner's row is every rank's row.
4. Second barrier; every rank copies the other shards' new residual chunks and normalises them
   with the owner's ``rstd``: the same bits on every rank.

A chunk (``CW`` columns) is walked in column blocks of ``BLOCK_C`` (at most ``TWOSHOT_MAX_COLS``
on GPUs), so a whole row can be one chunk without a register tile of the whole row. Steps 1 and 4
touch a block of row ``r`` of every shard as one 2-D access (a row per shard), every load issued
before the first store, as in ``allreduce.twoshot``. Step 3 takes two passes over its blocks: the
first sums, adds and stores the new residual (and pushes it) while it accumulates the sum of
squares; the second, after a CTA barrier, reads the stored residual back (this program's own
writes, so no other ordering is needed) and normalises.
Rows are cut into several chunks only when there are too few rows to keep the programs busy: every
cut row costs an exchange of partial sums between programs (an L2 round trip per row), which at
prefill sizes (hundreds of rows per program) added up to more than the all-reduce saves.

As in ``allreduce.twoshot``, no buffer needs a parity copy. Over NVLink this moves what the bare
two-shot moves (plus one float per row); the extra work is local (residual in and out, output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import barrier, epoch_commit, heap_ptr, next_pow2, pow2_at_least, program_epoch
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import Workspace
from .algorithm import FusedAlgorithm
from .rows import add_residual, block_cols, fp8_inverse_scale, load_chunk, row_rstd_from_partial, store_norm, work_item

__all__ = ["TWOSHOT_MAX_COLS", "TWOSHOT_MAX_COLS_CPU", "FusedTwoShot", "twoshot_allreduce_add_rmsnorm_kernel"]

#: The two-shot walks a chunk in column blocks of at most this many columns (GPUs), so its 2-D
#: accesses (a block of W rows) stay in registers; the CPU world uses smaller blocks so that its
#: tests walk several.
TWOSHOT_MAX_COLS = 2048
TWOSHOT_MAX_COLS_CPU = 1024


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def twoshot_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                         bases, rank, timeout, diag_addr, flags_off, epochs_off, rs_off, ag_off,
                                         rstd_off, slot_bytes, rstd_slot, xch_off, sig, WORLD: tl.constexpr,
                                         CH: tl.constexpr, BLOCK_C: tl.constexpr, GEMMA: tl.constexpr,
                                         FP8: tl.constexpr, ENGINE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    W2: tl.constexpr = next_pow2(WORLD)
    diag = address_ptr(diag_addr, tl.int64)
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    R = tl.cdiv(T, WORLD)
    iters = tl.cdiv(R * CH - pid, nprog)
    nblk = tl.cdiv(CW, BLOCK_C)
    src = tl.arange(0, W2)  # a shard (its owner) per row of the 2-D accesses below
    others = (src != rank) & (src < WORLD)
    slot_elems = slot_bytes // (DTYPE.primitive_bitwidth // 8)
    for i in range(0, iters):  # 1. reduce-scatter push: chunk c of row r of every other shard, to its owner
        r, c = work_item(pid, i, nprog, CH)
        rows = src * R + r
        dst = heap_ptr(bases, tl.where(src < WORLD, src, rank), rs_off + rank * slot_bytes, DTYPE) + r * H
        for b in range(0, nblk):
            cols, cmask = block_cols(c, b, H, CW, BLOCK_C)
            m = (others & (rows < T))[:, None] & cmask[None, :]
            v = tl.load(x_ptr + rows[:, None] * H + cols[None, :], mask=m)  # every load before the first store
            tl.store(dst[:, None] + cols[None, :], v, mask=m)
    if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
        iters = iters * 0  # a rank called another collective: push and write nothing more
    for i in range(0, iters):  # 2. my rows: reduce, add, normalise; push the new residual and rstd
        r, c = work_item(pid, i, nprog, CH)
        row = rank * R + r
        if row < T:
            part = 0.0
            for b in range(0, nblk):  # pass 1: the new residual (stored, pushed) and its sum of squares
                cols, cmask = block_cols(c, b, H, CW, BLOCK_C)
                res = load_chunk(res_ptr, row, H, cols, cmask)
                acc = tl.zeros([BLOCK_C], dtype=tl.float32)
                for s in tl.static_range(WORLD):
                    if s == rank:
                        acc += tl.load(x_ptr + row * H + cols, mask=cmask, other=0.0).to(tl.float32)
                    else:
                        src_s = heap_ptr(bases, rank, rs_off + s * slot_bytes, DTYPE) + r * H
                        acc += tl.load(src_s + cols, mask=cmask, other=0.0).to(tl.float32)
                resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask, ENGINE)
                for s in tl.static_range(WORLD):
                    if s != rank:
                        tl.store(heap_ptr(bases, s, ag_off + rank * slot_bytes, DTYPE) + r * H + cols, resid,
                                 mask=cmask)
                v = resid.to(tl.float32)
                part += tl.sum(v * v, axis=0)
            rstd = row_rstd_from_partial(part, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH)
            if c == 0:
                for s in tl.static_range(WORLD):
                    if s != rank:
                        tl.store(heap_ptr(bases, s, rstd_off + rank * rstd_slot, tl.float32) + r, rstd)
            tl.debug_barrier()  # pass 2 reads what pass 1 stored (the same layout: the same threads)
            for b in range(0, nblk):  # pass 2: normalise
                cols, cmask = block_cols(c, b, H, CW, BLOCK_C)
                resid = load_chunk(res_out_ptr, row, H, cols, cmask)
                w = load_chunk(w_ptr, 0, 0, cols, cmask)
                store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA, FP8, ENGINE)
    barrier(bases, rank, WORLD, flags_off, pid + nprog, e, timeout, diag)
    for i in range(0, iters):  # 3. the other shards' rows: take the new residual and rstd, normalise (2-D)
        r, c = work_item(pid, i, nprog, CH)
        rows = src * R + r
        ok = others & (rows < T)
        ag = heap_ptr(bases, rank, ag_off, DTYPE) + src * slot_elems + r * H
        rstd = tl.load(heap_ptr(bases, rank, rstd_off, tl.float32) + src * (rstd_slot // 4) + r, mask=ok, other=0.0)
        for b in range(0, nblk):
            cols, cmask = block_cols(c, b, H, CW, BLOCK_C)
            w = load_chunk(w_ptr, 0, 0, cols, cmask)
            m = ok[:, None] & cmask[None, :]
            resid = tl.load(ag[:, None] + cols[None, :], mask=m)
            tl.store(res_out_ptr + rows[:, None] * H + cols[None, :], resid, mask=m)
            store_norm(resid, rstd[:, None], rows[:, None], H, cols[None, :], m, w[None, :], out_ptr, inv_scale,
                       GEMMA, FP8, ENGINE)
    epoch_commit(epoch_ptr, e)


class FusedTwoShot(FusedAlgorithm):
    """Launcher of ``twoshot_allreduce_add_rmsnorm_kernel``. Workspace: ``rs`` and ``ag``, W shard
    slots each (about 2 x the largest input), W ``rstd`` slots, two barrier slots per program, the
    row exchange."""

    name = "twoshot"
    kernel = twoshot_allreduce_add_rmsnorm_kernel

    def layout(self) -> Workspace:
        shard_rows = cdiv(self.rows, self.world)
        self.shard_bytes = round_up(shard_rows * self.plan.max_hidden * 2, 256)
        self.rstd_slot = round_up(shard_rows * 4, 256)
        self.xch_rel = 2 * self.world * self.shard_bytes + self.world * self.rstd_slot
        return Workspace(barrier_slots=2 * self.grid, buffer_bytes=self.xch_rel + self.exchange_bytes)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        t, h = x.shape
        ch, cw = self.plan.chunks(cdiv(t, self.world), h, self.grid)  # a shard's rows
        block = min(self._block(cw), TWOSHOT_MAX_COLS if self.plan.cuda else TWOSHOT_MAX_COLS_CPU)
        c = self.channel
        rs = c.buffer_off
        ag = rs + self.world * self.shard_bytes
        self.launcher(
            *self._args(x, residual, residual_out, weight, out, scale, cw, eps), c.flags_off, c.epochs_off, rs, ag,
            ag + self.world * self.shard_bytes, self.shard_bytes, self.rstd_slot, c.buffer_off + self.xch_rel, sig,
            **self._meta(ch, block, block * pow2_at_least(self.world), gemma, fp8, engine))
