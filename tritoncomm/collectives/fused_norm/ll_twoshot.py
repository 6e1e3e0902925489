"""All-reduce + residual add + RMSNorm with the LL two-shot: the mid-size decode variant.

The all-reduce is ``allreduce.ll_twoshot``'s (LL8 packets both ways, no barrier), cut along rows:
a row's ``CH = NQ x W`` chunks of ``CW`` columns form ``NQ`` groups of ``W`` consecutive chunks, and
chunk ``q * W + s`` of every row is owned by rank ``s``. Program ``pid`` handles groups ``pid, pid +
P, ...`` (group ``g`` is row ``g // NQ``, chunks ``(g % NQ) * W + 0..W-1``):

1. push every other rank's chunk of the group to its owner (packets into its ``rs`` buffer);
2. sum my chunk over ranks 0..W-1 in fp32, add the residual (loaded before the wait) and round once:
   the new residual. Store it and push it to every peer (packets into their ``ag`` buffers);
3. poll the other chunks' new residual from my ``ag`` buffer and store them: every rank now holds
   the group's whole new residual, with the owners' bits;
4. the row's sum of squares: one fp32 partial per chunk, exchanged between the row's ``NQ``
   programs as LL8 packets (as ``fused_norm.rows.row_rstd_from_partial`` does) and added in chunk order,
   then normalise the group's ``W`` chunks and store them.

Residuals and outputs are the same bits on every rank. Compared with the LL one-shot variant
(``fused_norm.ll``), each GPU sends half the bytes at TP4 (the owner sends a chunk once, reduced),
for one more trip over NVLink. Buffer reuse by epoch parity and program 0's tokens are as in
``allreduce.ll_twoshot``. The row exchange needs a row's ``NQ`` programs in the same round
(``P`` a multiple of ``NQ``); in the CPU world ``NQ`` is 1 (no program waits for another of its
rank). Layout: ``rs``/``ag`` ``[2][W][slot_words]`` packets, group ``g`` at word ``g * cww``
(``cww = CW / 2``); the row exchange at ``xch_off``, ``CH`` packets per row; 16-bit inputs only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    epoch_commit,
    heap_ptr,
    ll8_poll_sum_f32,
    ll8_store,
    next_pow2,
    pow2_at_least,
    program_epoch,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import round_up
from ..allreduce.ll import LL_TRIES, ll_send_signature, ll_sum_ranks, load_words
from ..allreduce.ll_twoshot import LLTwoShot, ll_wait_rows, to_words, token_check, token_send, words_to
from ..base import Workspace
from .algorithm import FusedAlgorithm
from .rows import LL2_MAX_CHUNKS, add_residual, fp8_inverse_scale, load_chunk, norm_values

__all__ = ["FusedLLTwoShot", "ll_twoshot_allreduce_add_rmsnorm_kernel"]


@triton.jit
def _group_tile(g, H, CW, cww, row_words, rank, WORLD: tl.constexpr, NQ: tl.constexpr, BLOCK_C: tl.constexpr):
    """Group ``g``'s row, its ``[W2, BLOCK_C]`` columns and their mask, the mask of its
    ``[W2, BLOCK_C / 2]`` words, and which tile rows (chunks) other ranks own."""
    W2: tl.constexpr = next_pow2(WORLD)
    row = (g // NQ).to(tl.int64)
    c = (g % NQ) * WORLD + tl.arange(0, W2)  # the group's chunks; row s is owned by rank s
    jc = tl.arange(0, BLOCK_C)
    jw = tl.arange(0, BLOCK_C // 2)
    live = (tl.arange(0, W2) < WORLD)[:, None]
    cols = c[:, None] * CW + jc[None, :]
    cmask = live & (jc[None, :] < CW) & (cols < H)
    wds = c[:, None] * cww + jw[None, :]
    wmask = live & (jw[None, :] < cww) & (wds < row_words)
    others = (tl.arange(0, W2) != rank)[:, None]
    return row, cols, cmask, wmask, others


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def ll_twoshot_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                            bases, rank, timeout, diag_addr, epochs_off, rs_off, ag_off, tok_off,
                                            slot_words, xch_off, row_words, cww, hdr_off, sig, WORLD: tl.constexpr,
                                            NQ: tl.constexpr, BLOCK_C: tl.constexpr, GEMMA: tl.constexpr,
                                            FP8: tl.constexpr, TRIES: tl.constexpr = LL_TRIES,
                                            ENGINE: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    BW: tl.constexpr = BLOCK_C // 2
    W2: tl.constexpr = next_pow2(WORLD)
    CH: tl.constexpr = NQ * WORLD
    diag = address_ptr(diag_addr, tl.int64)
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    k = tl.arange(0, W2)
    if pid == 0:  # this rank has started the launch (see allreduce.ll_twoshot)
        token_send(bases, rank, tok_off, parity, e, WORLD)
    iters = tl.cdiv(T * NQ - pid, nprog)
    if sig is not None:  # the call check (``allreduce.ll``): my signature into every peer's packets for pid
        if iters > 0:
            ll_send_signature(bases, rank, hdr_off, parity, pid, nprog, sig, e, WORLD)
    to_owner = heap_ptr(bases, tl.where(k < WORLD, k, rank), rs_off + (parity * WORLD + rank) * slot_words * 8,
                        tl.uint64)
    for i in range(0, iters):  # 1. my copy of every other rank's chunk, to its owner
        g = pid + i * nprog
        row, cols, cmask, wmask, others = _group_tile(g, H, CW, cww, row_words, rank, WORLD, NQ, BLOCK_C)
        v = tl.load(x_ptr + row * H + cols, mask=cmask & others, other=0.0)
        lo, hi = tl.split(tl.reshape(v.to(tl.uint16, bitcast=True), [W2, BW, 2]))
        words = lo.to(tl.uint32) | (hi.to(tl.uint32) << 16)
        ll8_store(to_owner[:, None] + g * cww + tl.arange(0, BW)[None, :], words, e, mask=wmask & others)
    ag_slot = ag_off + (parity * WORLD + rank) * slot_words * 8
    hdrs = heap_ptr(bases, rank, hdr_off + ((parity * WORLD * nprog + pid) * 2) * 8, tl.uint64)  # mine, from s
    ok = tl.full([], 1, tl.int1)
    for i in range(0, iters):
        if ok:  # a program whose first group found a different call writes nothing
            g = pid + i * nprog
            row, cols, cmask, wmask, others = _group_tile(g, H, CW, cww, row_words, rank, WORLD, NQ, BLOCK_C)
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0)  # the weight and my chunk's residual before any wait
            c = (g % NQ) * WORLD + rank  # 2. my chunk: sum over ranks, add the residual, round, share
            mcols = c * CW + tl.arange(0, BLOCK_C)
            mmask = (tl.arange(0, BLOCK_C) < CW) & (mcols < H)
            res = load_chunk(res_ptr, row, H, mcols, mmask)
            jw = tl.arange(0, BW)
            mwmask = (jw < cww) & (c * cww + jw < row_words)
            own = load_words(x_ptr + row * H + c * CW, tl.minimum(CW, H - c * CW), 0, BW)
            acc, same = ll_sum_ranks(own, g * cww + jw, mwmask, bases, rank, rs_off, parity, slot_words, e, g, timeout,
                                     diag, WORLD, BW, DTYPE, TRIES, hdrs=hdrs, hstride=nprog * 2, check=i == 0,
                                     sig=sig)
            ok = same
            if same:
                mine = add_residual(acc, res, res_out_ptr, row, H, mcols, mmask, ENGINE)
                words = to_words(mine, BW)
                for p in tl.static_range(WORLD):  # branch-free, as in allreduce.ll_twoshot
                    ll8_store(heap_ptr(bases, p, ag_slot, tl.uint64) + g * cww + jw, words, e,
                              mask=mwmask & (p != rank))
                # 3. the other chunks' new residual from their owners
                src = heap_ptr(bases, rank, ag_off, tl.uint64) + (parity * WORLD + k[:, None]) * slot_words + \
                    g * cww + jw[None, :]
                got = ll_wait_rows(src, wmask & others, e, rank, g, timeout, diag, WORLD, TRIES)
                theirs = words_to(got, DTYPE, W2, BW)
                tl.store(res_out_ptr + row * H + cols, theirs, mask=cmask & others)
                resid = tl.where(others, theirs, mine[None, :]).to(tl.float32)
                resid = tl.where(cmask, resid, 0.0)
                # 4. the row's sum of squares: a partial per chunk, in chunk order across the row's programs
                part = tl.sum(resid * resid, axis=1)
                if NQ == 1:
                    total = tl.sum(tl.where(k < WORLD, part, 0.0), axis=0)
                else:
                    slots = heap_ptr(bases, rank, xch_off, tl.uint64) + row * CH
                    ll8_store(slots + (g % NQ) * WORLD + k, part.to(tl.uint32, bitcast=True), e, mask=k < WORLD)
                    CH2: tl.constexpr = next_pow2(CH)
                    kk = tl.arange(0, CH2)
                    total = ll8_poll_sum_f32(slots + kk, kk < CH, e, rank, row, rank, timeout, diag)
                rstd = 1.0 / tl.sqrt(total / H + eps)
                y = norm_values(resid.to(DTYPE), rstd, w, GEMMA, FP8, ENGINE, inv_scale)
                tl.store(out_ptr + row * H + cols, round_to(y, out_ptr.dtype.element_ty), mask=cmask)
    if pid == 0:  # every peer has started this launch
        token_check(bases, rank, tok_off, parity, e, timeout, diag, WORLD)
    epoch_commit(epoch_ptr, e)


class FusedLLTwoShot(FusedAlgorithm):
    """Launcher of ``ll_twoshot_allreduce_add_rmsnorm_kernel``. Workspace: ``rs`` and ``ag``, each 2
    (parities) x W slots of LL8 packets for every group of the largest input at any ``NQ`` it may
    use, the tokens, and the row exchange (``NQ x W`` packets per row)."""

    name = "ll_twoshot"
    kernel = ll_twoshot_allreduce_add_rmsnorm_kernel
    limit = LLTwoShot.limit

    def layout(self) -> Workspace:
        shapes = self.plan.ll2_shapes(self.plan.max_hidden)
        self.slot_words = round_up(max(self.rows * nq * (cw // 2) for nq, cw in shapes), 16)
        self.half = 2 * self.world * self.slot_words * 8
        self.xch_rel = 2 * self.half + 256  # rs, ag, tokens; then the row exchange; then the signature packets
        self.hdr_rel = self.xch_rel + round_up(self.rows * max(LL2_MAX_CHUNKS, self.world) * 8, 256)
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 2 * 8)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        t, h = x.shape
        nq, cw = self.plan.ll2_groups(t, h)  # NQ groups of W chunks per row
        block = self._block(cw)
        meta = self._meta(nq, block, block * pow2_at_least(self.world), gemma, fp8, engine,
                          polled=block // 2)
        meta["NQ"] = meta.pop("CH")
        c = self.channel
        rs = c.buffer_off
        self.launcher(
            *self._args(x, residual, residual_out, weight, out, scale, cw, eps), c.epochs_off, rs, rs + self.half,
            rs + 2 * self.half, self.slot_words, c.buffer_off + self.xch_rel, (h + 1) // 2, cw // 2,
            c.buffer_off + self.hdr_rel, sig, **meta)
