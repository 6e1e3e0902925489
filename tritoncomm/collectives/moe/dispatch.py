"""MoE dispatch: each token goes once to every rank that holds one of its experts, then each rank lays
its received tokens out per expert.

``moe_send_kernel``: program ``pid`` takes tokens ``pid, pid + grid, ...``; token ``t`` is stored into
row ``rank * max_tokens + t`` of the receive buffer of every rank ``d`` with ``dest[t, d]`` (this rank's
own buffer included), in the half of the buffer given by the launch's epoch parity; then a barrier on
slot ``pid``. Once the kernel has ended on a rank, every peer's programs have made their stores
(each stored before arriving at the barrier its counterpart waited on), so later kernels on the stream
may read the buffer. A rank cannot start launch ``n + 2`` (same parity) before every peer has
passed launch ``n + 1``'s barriers, i.e. before every peer's stream is past its reads of launch ``n``.

``moe_layout_kernel`` (local): entry ``i`` (token ``i // top_k`` of the gathered routing) is copied
from receive row ``i // top_k`` to output row ``dst[i]`` where ``dst[i] >= 0``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import barrier, epoch_commit, heap_ptr, program_epoch

__all__ = ["launch_layout", "launch_send", "moe_layout_kernel", "moe_send_kernel"]


@triton.jit(do_not_specialize=["rank"])
def moe_send_kernel(x_ptr, dest_ptr, n_tokens, hidden, max_tokens, bases, rank, timeout, diag_addr, flags_off,
                    epochs_off, recv_off, half_bytes, WORLD: tl.constexpr, BLOCK_H: tl.constexpr):
    """Push each of this rank's tokens to the ranks ``dest`` (int8 ``[max_tokens, WORLD]``) marks."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    base = recv_off + (e & 1).to(tl.int64) * half_bytes
    cols = tl.arange(0, BLOCK_H)
    for t in range(pid, n_tokens, grid):
        row = tl.cast(rank * max_tokens + t, tl.int64) * hidden * ESIZE
        for d in tl.static_range(WORLD):
            if tl.load(dest_ptr + t * WORLD + d) != 0:
                dst = heap_ptr(bases, d, base + row, DTYPE, ALIGNED=False)
                for c in range(0, hidden, BLOCK_H):
                    m = c + cols < hidden
                    tl.store(dst + c + cols, tl.load(x_ptr + tl.cast(t, tl.int64) * hidden + c + cols, mask=m), mask=m)
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    epoch_commit(epoch_ptr, e)


@triton.jit(do_not_specialize=["rank"])
def moe_layout_kernel(out_ptr, dst_ptr, n_entries, hidden, bases, rank, epochs_off, recv_off, half_bytes,
                      TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """``out[dst[i]] = recv[i // TOP_K]`` for every entry ``i`` with ``dst[i] >= 0``, from the half of the
    receive buffer the last send wrote (the parity of the epoch its program 0 stored)."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    e = tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32))
    recv_ptr = heap_ptr(bases, rank, recv_off + (e & 1).to(tl.int64) * half_bytes, DTYPE)
    i = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    dst = tl.load(dst_ptr + i, mask=i < n_entries, other=-1).to(tl.int64)
    src = (i // TOP_K).to(tl.int64)
    ok = dst >= 0
    cols = tl.arange(0, BLOCK_H)
    for c in range(0, hidden, BLOCK_H):
        m = ok[:, None] & (c + cols < hidden)[None, :]
        v = tl.load(recv_ptr + src[:, None] * hidden + c + cols[None, :], mask=m)
        tl.store(out_ptr + dst[:, None] * hidden + c + cols[None, :], v, mask=m)


def launch_send(comm, channel, x: torch.Tensor, dest: torch.Tensor, n_tokens: int, max_tokens: int,
                recv_off: int, half_bytes: int, programs: int, block_h: int, num_warps: int) -> None:
    bases, rank, world, timeout, diag = comm.kernel_args()
    moe_send_kernel[(programs,)](x, dest, n_tokens, x.shape[-1], max_tokens, bases, rank, timeout, diag,
                                 channel.flags_off, channel.epochs_off, recv_off, half_bytes, WORLD=world,
                                 BLOCK_H=block_h, num_warps=num_warps)


def launch_layout(comm, channel, out: torch.Tensor, dst: torch.Tensor, recv_off: int, half_bytes: int, top_k: int,
                  block_h: int, num_warps: int, block_e: int = 8) -> None:
    bases, rank, _, _, _ = comm.kernel_args()
    n = dst.numel()
    moe_layout_kernel[(triton.cdiv(n, block_e),)](out, dst, n, out.shape[-1], bases, rank, channel.epochs_off,
                                                  recv_off, half_bytes, TOP_K=top_k, BLOCK_E=block_e,
                                                  BLOCK_H=block_h, num_warps=num_warps)
