"""Reduce-scatter into a tensor: every rank pushes shard ``s`` of its input into slot [my rank] of
rank ``s``'s buffer, meets its peers at a barrier, then sums its own shard over ranks 0..W-1 in that
order (fp32 accumulation; every rank's result is bitwise what a single fixed order gives).

Buffers alternate by epoch parity as in ``allgather.push``; shards of different sizes (``VAR``) as
there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import assume_multiple, barrier, epoch_commit, heap_ptr, program_epoch, round_to
from ...kernels.memory import address_ptr
from ..base import PeerOutput
from ..selection import Choice
from .push import PushAlgorithm, shard

__all__ = ["ReduceScatterPush", "reducescatter_kernel"]


@triton.jit(do_not_specialize=["rank", "rows_lo", "rows_hi", "sig"])  # one kernel for every rank and size mix
def reducescatter_kernel(x_ptr, out_ptr, m, bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off,
                         half_bytes, stride, active, rows_lo=0, rows_hi=0, row=1, sig=None, WORLD: tl.constexpr = 2,
                         BLOCK: tl.constexpr = 1024, MDIV: tl.constexpr = 1, VAR: tl.constexpr = False):
    """``out = sum over ranks r of x_r[rank*m:(rank+1)*m]`` (with ``VAR``: of rank ``rank``'s shard
    at its offset, ``m`` its count, ``stride`` the largest); ``m`` (and with ``VAR`` ``row``) is a
    multiple of ``MDIV``. ``sig``: the call's signature, compared at the barrier; where a rank's
    differs nothing is written."""
    pid = tl.program_id(0)
    m = assume_multiple(m, MDIV)
    if VAR:
        row = assume_multiple(row, MDIV)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        base = buf_off + (e & 1).to(tl.int64) * half_bytes
        span = m
        if VAR:
            span = stride
        iters = tl.cdiv(tl.cdiv(span, BLOCK) - pid, active)
        for i in range(0, iters):
            j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
            for s in tl.static_range(WORLD):
                if s != rank:
                    off, n = shard(s, m, rows_lo, rows_hi, row, WORLD, VAR)
                    v = tl.load(x_ptr + off + j, mask=j < n)
                    tl.store(heap_ptr(bases, s, base + rank * stride * ESIZE, DTYPE) + j, v, mask=j < n)
        if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
            iters = iters * 0  # a rank called another collective: write nothing
        own_off, _ = shard(rank, m, rows_lo, rows_hi, row, WORLD, VAR)
        for i in range(0, iters):
            j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
            mask = j < m
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    acc += tl.load(x_ptr + own_off + j, mask=mask).to(tl.float32)
                else:
                    acc += tl.load(heap_ptr(bases, rank, base + s * stride * ESIZE, DTYPE) + j,
                                   mask=mask).to(tl.float32)
            tl.store(out_ptr + j, round_to(acc, DTYPE), mask=mask)
    epoch_commit(epoch_ptr, e)


class ReduceScatterPush(PushAlgorithm):
    """Launcher of ``reducescatter_kernel``: push every shard to its owner, barrier, sum mine."""

    name = "push"
    kernel = reducescatter_kernel

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None,
               var: tuple[tuple[int, ...], int] | None = None) -> None:
        self._run(x, out, m, c, sig, var=var)
