"""MoE dispatch, steps 2 and 3 of 3 (local: they read only this rank's heap, after the send kernel).

Every rank holds every rank's routing after step 1, so every rank computes the same slots without
talking: the entries ``i = (source rank, token, j)`` (flattened in that order) of expert ``e`` get
slots ``0, 1, ...`` in order; entries at or past ``capacity`` are dropped.

``moe_route_kernel``: program ``e`` (one per expert, every rank runs all of them) scans the ids table
in order, each source's rows below its token count only, keeping a running count. For this rank's
own entries of ``e`` it writes where ``combine`` will find the expert's output (``owner``, and ``row =
local expert * capacity + slot``; dropped entries keep ``owner = -1`` and are counted in ``bad[1]``).
If ``e`` is one of this rank's experts it also writes, for each kept entry, the receive row it came
from (``src[local expert, slot]``), for each entry its row in the expert buffer or -1 if dropped
(``slot_of[entry]``, read by the owner-side combine), and the expert's count (``min(entries,
capacity)``).

``moe_gather_kernel``: programs ``(expert, p)`` copy the rows below the expert's count from the
receive buffer into ``out[expert, slot]`` (and, with ``FP8``, their scales), ``BLOCK_S`` rows at a
time, program ``p`` taking the items ``p, p + grid_1, ...`` of those row blocks (``shares.py``);
program ``(0, 0)`` also copies the two problem counters into host-mapped words, which the host
reads without synchronising.

Both read the tables' half given by the parity of the epoch the send kernel's program 0 stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import heap_ptr
from ...kernels.launcher import Launcher
from .shares import column_shares, share_columns

__all__ = ["launch_gather", "launch_route", "moe_gather_kernel", "moe_route_kernel"]


@triton.jit(do_not_specialize=["rank"])
def moe_route_kernel(owner_ptr, row_ptr, src_ptr, slot_ptr, counts_ptr, bad_ptr, max_tokens, capacity, bases, rank,
                     epochs_off, ids_off, ids_half, ntab_off, ntab_half, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                     TOP_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """See the module docstring."""
    e = tl.program_id(0)
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    ids = heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32)
    ntab = heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32)
    owner = e // LOCAL
    mine = owner == rank
    el = e - owner * LOCAL
    seen = 0
    dropped = 0
    for s in range(WORLD):
        n_s = tl.load(ntab + s) * TOP_K  # the source's live entries
        base = s * max_tokens * TOP_K
        own = s == rank
        for b in range(0, n_s, BLOCK_E):
            k = b + tl.arange(0, BLOCK_E)
            i = base + k
            hit = tl.load(ids + i, mask=k < n_s, other=-1) == e
            n_hit = tl.sum(hit.to(tl.int32))
            if n_hit > 0:
                slot = seen + tl.cumsum(hit.to(tl.int32), 0) - 1
                keep = hit & (slot < capacity)
                if own:
                    tl.store(owner_ptr + k, tl.where(keep, owner, -1), mask=hit)
                    tl.store(row_ptr + k, el * capacity + slot, mask=keep)
                    dropped += tl.sum((hit & ~keep).to(tl.int32))
                if mine:
                    tl.store(src_ptr + el * capacity + slot, i // TOP_K, mask=keep)
                    tl.store(slot_ptr + i, tl.where(keep, el * capacity + slot, -1), mask=hit)
                seen += n_hit
    if mine:
        tl.store(counts_ptr + el, tl.minimum(seen, capacity))
    if dropped > 0:
        tl.atomic_add(bad_ptr + 1, dropped.to(tl.int64))


@triton.jit(do_not_specialize=["rank"])
def moe_gather_kernel(out_ptr, sc_out_ptr, src_ptr, counts_ptr, bad_ptr, bad_host_addr, hidden, capacity, bases, rank,
                      epochs_off, recv_off, recv_half, sc_off, sc_half, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                      FP8: tl.constexpr, BLOCK_G: tl.constexpr = 1):
    """See the module docstring."""
    el = tl.program_id(0)
    p = tl.program_id(1)
    grid = tl.num_programs(1)
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    recv = heap_ptr(bases, rank, recv_off + parity * recv_half, DTYPE)
    count = tl.load(counts_ptr + el)
    if el == 0 and p == 0:
        two = tl.arange(0, 2)
        tl.store(bad_host_addr.to(tl.pointer_type(tl.int64)) + two, tl.load(bad_ptr + two))
    cols = tl.arange(0, BLOCK_H)
    out = out_ptr + tl.cast(el, tl.int64) * capacity * hidden
    row_blocks = tl.cdiv(count, BLOCK_S)
    shares = column_shares(row_blocks, hidden, grid, BLOCK_H)
    for item in range(p, row_blocks * shares, grid):
        s = item // shares * BLOCK_S + tl.arange(0, BLOCK_S)
        sm = s < count
        src = tl.load(src_ptr + el * capacity + s, mask=sm, other=0).to(tl.int64)
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        for c in range(lo, hi, BLOCK_H):
            m = sm[:, None] & (c + cols < hidden)[None, :]
            v = tl.load(recv + src[:, None] * hidden + c + cols[None, :], mask=m)
            tl.store(out + s[:, None].to(tl.int64) * hidden + c + cols[None, :], v, mask=m)
        if FP8 and item % shares == 0:
            groups = hidden // 128
            sc = heap_ptr(bases, rank, sc_off + parity * sc_half, tl.float32)
            sc_out = sc_out_ptr + tl.cast(el, tl.int64) * capacity * groups
            gcols = tl.arange(0, BLOCK_G)  # a block the size of a row's scales, not of its values
            for c in range(0, groups, BLOCK_G):
                m = sm[:, None] & (c + gcols < groups)[None, :]
                v = tl.load(sc + src[:, None] * groups + c + gcols[None, :], mask=m)
                tl.store(sc_out + s[:, None].to(tl.int64) * groups + c + gcols[None, :], v, mask=m)


def launch_route(run: Launcher, comm, channel, owner: torch.Tensor, row: torch.Tensor, src: torch.Tensor,
                 slot_of: torch.Tensor, counts: torch.Tensor, bad: torch.Tensor, *, max_tokens: int, capacity: int,
                 local: int, top_k: int, ids_off: int, ids_half: int, ntab_off: int, ntab_half: int, block_e: int,
                 num_warps: int) -> None:
    """Launch ``moe_route_kernel`` through ``run`` (its launcher: one program per expert)."""
    bases, rank, world, _, _ = comm.kernel_args()
    run(owner, row, src, slot_of, counts, bad, max_tokens, capacity, bases, rank, channel.epochs_off, ids_off,
        ids_half, ntab_off, ntab_half, WORLD=world, LOCAL=local, TOP_K=top_k, BLOCK_E=block_e, num_warps=num_warps)


def launch_gather(run: Launcher, comm, channel, out: torch.Tensor, scales: torch.Tensor | None, src: torch.Tensor,
                  counts: torch.Tensor, bad: torch.Tensor, bad_host_addr: int, *, recv_off: int, recv_half: int,
                  sc_off: int, sc_half: int, block_s: int, block_h: int, num_warps: int) -> None:
    """Launch ``moe_gather_kernel`` through ``run`` (its launcher: local experts x gather programs)."""
    bases, rank, _, _, _ = comm.kernel_args()
    _, capacity, hidden = out.shape
    fp8 = scales is not None
    run(out, scales if fp8 else out, src, counts, bad, bad_host_addr, hidden, capacity, bases, rank,
        channel.epochs_off, recv_off, recv_half, sc_off, sc_half, BLOCK_S=block_s, BLOCK_H=block_h, FP8=fp8,
        BLOCK_G=min(triton.next_power_of_2(max(hidden // 128, 1)), block_h), num_warps=num_warps)
