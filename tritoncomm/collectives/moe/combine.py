"""MoE combine: every rank reads its tokens' expert outputs from the experts' owners and sums them.

``moe_combine_kernel``: each rank has copied its experts' outputs into its heap buffer before the
launch (a prior op on its stream); a barrier on slot ``pid`` makes every owner's buffer visible
(release at arrival covers the owner's earlier stream work). Program ``pid`` then takes tokens
``pid, pid + grid, ...`` and, for each column block, accumulates ``w[t, j] * y[owner[t, j]][row[t, j]]``
in fp32 for ``j = 0 .. TOP_K - 1`` in that order, each product rounded before its add (no fused
multiply-add: the launch turns contraction off, so both worlds and torch's ``acc + w * y`` agree);
entries with ``owner < 0`` add exactly nothing. The bits depend only on the inputs, never on
arrival order. An owner's buffer is next written after its next dispatch (by the experts, or by
``combine``'s copy), and no rank passes that dispatch's send barrier before every peer's combine
kernel has ended.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import barrier, epoch_commit, heap_ptr, program_epoch, round_to
from ...kernels.launcher import Launcher

__all__ = ["launch_combine", "moe_combine_kernel"]


@triton.jit(do_not_specialize=["rank", "n_tokens"])  # one build whatever the token count
def moe_combine_kernel(out_ptr, w_ptr, owner_ptr, row_ptr, n_tokens, hidden, bases, rank, timeout, diag_addr,
                       flags_off, epochs_off, ybuf_off, WORLD: tl.constexpr, TOP_K: tl.constexpr,
                       BLOCK_H: tl.constexpr):
    """``out[t] = sum_j w[t, j] * y_owner[row[t, j]]`` (fp32, in ``j`` order) for ``t < n_tokens``."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)  # every owner's buffer is written
    cols = tl.arange(0, BLOCK_H)
    for t in range(pid, n_tokens, grid):
        for c in range(0, hidden, BLOCK_H):
            m = c + cols < hidden
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for j in tl.static_range(TOP_K):  # no branch: the TOP_K loads are in flight together
                owner = tl.load(owner_ptr + t * TOP_K + j)
                row = tl.load(row_ptr + t * TOP_K + j).to(tl.int64)
                src = heap_ptr(bases, tl.maximum(owner, 0), ybuf_off, DTYPE, ALIGNED=False) + row * hidden + c + cols
                y = tl.load(src, mask=m & (owner >= 0), other=0.0).to(tl.float32)
                acc += tl.where(owner >= 0, tl.load(w_ptr + t * TOP_K + j) * y, 0.0)
            tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + c + cols, round_to(acc, DTYPE), mask=m)
    epoch_commit(epoch_ptr, e)


def launch_combine(run: Launcher, comm, channel, out: torch.Tensor, w: torch.Tensor, owner: torch.Tensor,
                   row: torch.Tensor, n_tokens: int, ybuf_off: int, block_h: int, num_warps: int) -> None:
    """Launch ``moe_combine_kernel`` through ``run`` (its launcher, one program per SM on GPUs)."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    run(out, w, owner, row, n_tokens, out.shape[-1], bases, rank, timeout, diag, channel.flags_off, channel.epochs_off,
        ybuf_off, WORLD=world, TOP_K=w.shape[-1], BLOCK_H=block_h, num_warps=num_warps, enable_fp_fusion=False)
