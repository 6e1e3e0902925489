"""All-reduce + residual add + RMSNorm with LL8 packets: the small-message variant (decode).

Work items are (row, chunk) pairs as in ``fused_norm.rows``. Program ``pid`` pushes its items' chunks
of ``x`` to every peer as LL8 packets (one 8-byte store carries 4 bytes of data and the launch's
epoch as flag), then polls the same chunks from every peer's packets and sums the ranks in order
0..W-1 in fp32 (``allreduce.ll.ll_sum_ranks``: rounds of looks at every peer's packets issued
together, its own chunk read from ``x``), adds the residual (loaded before the polls), rounds
once, exchanges the row's sum of squares with the row's other chunks (LL8 packets too) and
normalises.

No barrier, no fence and no separate signal, between ranks or between programs: a packet's flag
says its data is there. Receive buffers alternate by epoch parity, as in ``allreduce.ll``: a rank
can be at most one launch ahead of a peer that still reads. Buffer layout in every rank's heap:
``[parity][source rank][row][word]`` of uint64 packets, ``row_words = ceil(H / 2)`` words per row
(16-bit inputs only); chunks start at even columns (``CW`` is even), ``cww = CW / 2`` words.
``row_words`` and ``cww`` come from the host, so that Triton sees their divisibility and the
packets move as 16-byte stores and polls (computed here, they would compile to 8-byte ones).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import epoch_commit, heap_ptr, ll8_store, program_epoch
from ...kernels.memory import address_ptr
from ...units import round_up
from ..allreduce.ll import LL, ll_send_signature, ll_sum_ranks, load_words
from ..base import Workspace
from .algorithm import FusedAlgorithm
from .rows import add_residual, chunk_cols, fp8_inverse_scale, load_chunk, row_rstd, store_norm, work_item

__all__ = ["FusedLL", "ll_allreduce_add_rmsnorm_kernel"]


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def ll_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                    bases, rank, timeout, diag_addr, epochs_off, buf_off, slot_words, xch_off,
                                    row_words, cww, hdr_off, sig,
                                    WORLD: tl.constexpr, CH: tl.constexpr, BLOCK_C: tl.constexpr,
                                    GEMMA: tl.constexpr, FP8: tl.constexpr, ENGINE: tl.constexpr = False,
                                    TREE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    BW: tl.constexpr = BLOCK_C // 2
    diag = address_ptr(diag_addr, tl.int64)
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    wds = tl.arange(0, BW)
    iters = tl.cdiv(T * CH - pid, nprog)
    dst_off = buf_off + ((parity * WORLD + rank) * slot_words) * 8
    if sig is not None:  # the call check (``allreduce.ll``): my signature into every peer's packets for pid
        if iters > 0:
            ll_send_signature(bases, rank, hdr_off, parity, pid, nprog, sig, e, WORLD)
    for i in range(0, iters):  # 1. push my items' chunks to every peer
        row, c = work_item(pid, i, nprog, CH)
        wmask = (wds < cww) & (c * cww + wds < row_words)
        words = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_store(heap_ptr(bases, p, dst_off, tl.uint64) + row * row_words + c * cww + wds, words, e,
                          mask=wmask)
    hdrs = heap_ptr(bases, rank, hdr_off + ((parity * WORLD * nprog + pid) * 2) * 8, tl.uint64)  # mine, from s
    ok = tl.full([], 1, tl.int1)
    for i in range(0, iters):  # 2. sum the same chunks over ranks, add, normalise
        if ok:  # a program whose first item found a different call writes nothing
            row, c = work_item(pid, i, nprog, CH)
            wmask = (wds < cww) & (c * cww + wds < row_words)
            cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
            res = load_chunk(res_ptr, row, H, cols, cmask)
            w = load_chunk(w_ptr, 0, 0, cols, cmask)
            own = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
            acc, same = ll_sum_ranks(own, row * row_words + c * cww + wds, wmask, bases, rank, buf_off, parity,
                                     slot_words, e, row, timeout, diag, WORLD, BW, DTYPE, hdrs=hdrs,
                                     hstride=nprog * 2, check=i == 0, sig=sig)
            ok = same
            if same:
                resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask, ENGINE)
                rstd = row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH, TREE)
                store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA, FP8, ENGINE)
    epoch_commit(epoch_ptr, e)


class FusedLL(FusedAlgorithm):
    """Launcher of ``ll_allreduce_add_rmsnorm_kernel``. Workspace: 2 (parities) x W slots of the
    largest input as LL8 packets (4 x W x its bytes), the row exchange. At most 32 programs."""

    name = "ll"
    kernel = ll_allreduce_add_rmsnorm_kernel
    limit = LL.limit

    def layout(self) -> Workspace:
        self.slot_words = round_up(self.rows * ((self.plan.max_hidden + 1) // 2), 32)
        self.xch_rel = 2 * self.world * self.slot_words * 8
        self.hdr_rel = self.xch_rel + self.exchange_bytes  # the call check's signature packets
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 2 * 8)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        t, h = x.shape
        ch, cw = self.plan.chunks(t, h, self.grid)
        block = self._block(cw)
        c = self.channel
        self.launcher(
            *self._args(x, residual, residual_out, weight, out, scale, cw, eps), c.epochs_off, c.buffer_off,
            self.slot_words, c.buffer_off + self.xch_rel, (h + 1) // 2, cw // 2, c.buffer_off + self.hdr_rel, sig,
            **self._meta(ch, block, block, gemma, fp8, engine, polled=block // 2))
