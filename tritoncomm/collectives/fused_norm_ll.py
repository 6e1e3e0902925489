"""All-reduce + residual add + RMSNorm with LL8 packets: the small-message variant (decode).

Program ``pid`` owns rows ``pid, pid + P, ...``. It pushes each of its rows of ``x`` to every peer as
LL8 packets (one 8-byte store carries 4 bytes of data and the launch's epoch as flag), then polls
the same rows from every peer's packets, sums the ranks in order 0..W-1 in fp32 (its own row read
from ``x``), adds the residual, rounds once and normalises (``fused_norm.add_norm_row``).

No barrier and no separate signal: a packet's flag says its data is there. Receive buffers
alternate by epoch parity, as in ``allreduce_ll``: a rank can be at most one launch ahead of a peer
that still reads. Buffer layout in every rank's heap: ``[parity][source rank][row][word]`` of
uint64 packets, ``row_words = ceil(H / 2)`` words per row for 16-bit inputs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import epoch_commit, heap_ptr, ll8_poll, ll8_store, program_epoch
from .allreduce_ll import load_words, words_to_f32
from .fused_norm import add_norm_row, load_weight

__all__ = ["ll_allreduce_add_rmsnorm_kernel"]


@triton.jit
def ll_allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, eps,
                                    bases, rank, timeout, diag_addr, epochs_off, buf_off, slot_words,
                                    WORLD: tl.constexpr, BLOCK_W: tl.constexpr, GEMMA: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    row_words = (H + 1) // 2
    wds = tl.arange(0, BLOCK_W)
    wmask = wds < row_words
    iters = tl.cdiv(T - pid, nprog)
    dst_off = buf_off + ((parity * WORLD + rank) * slot_words) * 8
    for i in range(0, iters):  # 1. push my rows to every peer
        row = (pid + i * nprog).to(tl.int64)
        words = load_words(x_ptr + row * H, H, 0, BLOCK_W)
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_store(heap_ptr(bases, p, dst_off, tl.uint64) + row * row_words + wds, words, e, mask=wmask)
    cols = tl.arange(0, 2 * BLOCK_W)
    cmask = cols < H
    w = load_weight(w_ptr, cols, cmask, GEMMA)
    for i in range(0, iters):  # 2. sum the same rows over ranks, add, normalise
        row = (pid + i * nprog).to(tl.int64)
        acc = tl.zeros([2 * BLOCK_W], dtype=tl.float32)
        for s in tl.static_range(WORLD):
            if s == rank:
                words = load_words(x_ptr + row * H, H, 0, BLOCK_W)
            else:
                src = heap_ptr(bases, rank, buf_off + ((parity * WORLD + s) * slot_words) * 8, tl.uint64)
                words = ll8_poll(src + row * row_words + wds, wmask, e, s, row, rank, timeout, diag)
            acc += words_to_f32(words, DTYPE, BLOCK_W)
        add_norm_row(acc, res_ptr, res_out_ptr, row, H, cols, cmask, w, out_ptr, scale_ptr, eps, FP8)
    epoch_commit(epoch_ptr, e)
