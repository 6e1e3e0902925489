"""All-reduce + residual add + RMSNorm (+ FP8) on Lamport buffers: the decode variant.

Work items are (row, chunk) pairs as in ``fused_norm.rows``. Program ``pid`` stores its items' chunks
of ``x`` into slot [my rank] of every peer's Lamport buffer (``kernels.lamport``: the data is its own
flag), then, for the same chunks, polls the W-1 other slots of its own buffer until no element holds
the sentinel, sums the ranks in order 0..W-1 in fp32 (its own chunk read from ``x``; every rank's
values canonical, as ``allreduce.lamport`` explains), resets what it read, adds the residual (loaded
before the wait), rounds once, exchanges the row's sum of squares with the row's other chunks (LL8
packets) and normalises.

No barrier, no fence, no flag words, and with programmatic dependent launch its start overlaps the
previous kernel's end. Buffers alternate by launch parity (the argument of ``allreduce.lamport``);
layout in every rank's heap: ``[parity][source][row][column]`` of the input dtype, the row exchange
after them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    epoch_commit,
    heap_ptr,
    lamport_canonical,
    lamport_store,
    pdl_launch_dependents,
    pdl_wait,
    program_epoch,
)
from ...kernels.memory import address_ptr
from ...units import round_up
from ..allreduce.lamport import LAMPORT_TRIES, lamport_send_signature, lamport_sum_ranks
from ..base import Workspace
from .algorithm import FusedAlgorithm
from .rows import add_residual, chunk_cols, fp8_inverse_scale, load_chunk, row_rstd, store_norm, work_item

__all__ = ["LAMPORT_FUSED_PROGRAMS", "LAMPORT_WHOLE_ROWS_FROM", "FusedLamport", "lamport_allreduce_add_rmsnorm_kernel"]


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def lamport_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                         bases, rank, timeout, diag_addr, epochs_off, buf_off, slot_bytes, xch_off,
                                         hdr_off, sig, WORLD: tl.constexpr, CH: tl.constexpr, BLOCK_C: tl.constexpr,
                                         GEMMA: tl.constexpr, FP8: tl.constexpr, ENGINE: tl.constexpr = False,
                                         TRIES: tl.constexpr = LAMPORT_TRIES, TREE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = address_ptr(diag_addr, tl.int64)
    pdl_wait()  # launched with PDL: the previous kernel has ended
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    iters = tl.cdiv(T * CH - pid, nprog)
    slot_elems = slot_bytes // ESIZE
    if sig is not None:  # the call check (``allreduce.lamport``): my header into every peer's word for pid
        if iters > 0:
            lamport_send_signature(bases, rank, hdr_off, parity, pid, nprog, sig, WORLD)
    for i in range(0, iters):  # 1. my items' chunks into slot [rank] of every peer's buffer
        row, c = work_item(pid, i, nprog, CH)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        v = load_chunk(x_ptr, row, H, cols, cmask)
        for p in tl.static_range(WORLD):
            if p != rank:
                dst = heap_ptr(bases, p, buf_off + (parity * WORLD + rank) * slot_bytes, DTYPE)
                lamport_store(dst + row * H + cols, v, mask=cmask)
    pdl_launch_dependents()
    mine = heap_ptr(bases, rank, buf_off + parity * WORLD * slot_bytes, DTYPE)
    hdrs = heap_ptr(bases, rank, hdr_off + (parity * WORLD * nprog + pid) * 8, tl.int64)  # mine, from rank s
    ok = tl.full([], 1, tl.int1)
    for i in range(0, iters):  # 2. the same chunks from every rank, summed in rank order; add, normalise
        if ok:  # a program whose first item found a different call writes nothing
            row, c = work_item(pid, i, nprog, CH)
            cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
            res = load_chunk(res_ptr, row, H, cols, cmask)
            w = load_chunk(w_ptr, 0, 0, cols, cmask)
            own = lamport_canonical(load_chunk(x_ptr, row, H, cols, cmask))
            acc, same = lamport_sum_ranks(own, mine, slot_elems, row * H + cols, cmask, rank, row, timeout, diag,
                                          WORLD, TRIES, hdrs, nprog, i == 0, sig)
            ok = same
            if same:
                resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask, ENGINE)
                rstd = row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH, TREE)
                store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA, FP8, ENGINE)
    epoch_commit(epoch_ptr, e)


#: Programs of the Lamport variant's grid on GPUs: enough for one row (or one chunk) each at prefill
#: sizes, where the other variants' 64 leave SMs idle.
LAMPORT_FUSED_PROGRAMS = 256
#: From this many rows the Lamport variant keeps rows whole: the rows alone keep enough programs busy,
#: and a row cut into chunks pays an exchange of partial sums (``docs/algorithms.md``).
LAMPORT_WHOLE_ROWS_FROM = 128


class FusedLamport(FusedAlgorithm):
    """Launcher of ``lamport_allreduce_add_rmsnorm_kernel``. Workspace: 2 (parities) x W slots of the
    largest input, the row exchange. Buffers put at rest at set-up; launched with PDL on sm_90+."""

    name = "lamport"
    kernel = lamport_allreduce_add_rmsnorm_kernel
    limit = 16 << 20
    barriers = False
    pdl = True

    def layout(self) -> Workspace:
        self.slot_bytes = round_up(self.rows * self.plan.max_hidden * 2, 256)
        self.xch_rel = 2 * self.world * self.slot_bytes
        self.hdr_rel = self.xch_rel + self.exchange_bytes  # the call check's headers, 0 at rest
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 8, lamport_bytes=self.xch_rel)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        t, h = x.shape
        ch, cw = self.plan.chunks(t, h, self.grid) if t < LAMPORT_WHOLE_ROWS_FROM else (1, self.plan.chunk_width(h, 1))
        block = self._block(cw)
        c = self.channel
        # two 16-byte vectors per thread: cheap polls
        meta = self._meta(ch, block, block, gemma, fp8, engine, polled=block, warps=min(16, max(1, block // 512)))
        self.launcher(
            *self._args(x, residual, residual_out, weight, out, scale, cw, eps), c.epochs_off, c.buffer_off,
            self.slot_bytes, c.buffer_off + self.xch_rel, c.buffer_off + self.hdr_rel, sig, **meta, **self.launch_opts)
