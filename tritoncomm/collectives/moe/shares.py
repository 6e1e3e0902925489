"""How the MoE kernels split rows of ``hidden`` columns over their programs.

A program that takes a whole row waits on one round of loads per column block, one after another;
at decode there are fewer rows than programs, so most programs would idle while a few walk their
rows' blocks. Work items are therefore (row, share of its columns): item ``i`` is row ``i //
shares`` and the ``i % shares``-th of ``shares`` runs of consecutive columns (``share_columns``),
and program ``pid`` takes items ``pid, pid + grid, ...``. Runs are cut at multiples of ``min(BLOCK_H,
SHARE_STEP)`` columns, so a row spreads over as many programs at decode whatever the
kernel's block; a run's loop keeps the constant step ``BLOCK_H`` (masked at the run's end, which
keeps 16-byte accesses: both ends are multiples of 16 elements when ``hidden`` is). Two kernels
that split the same row count the same way give the same item to the same program.

``pick(v, kk, j)`` reads element ``j`` of a token's small routing vector (ids, slots, weights) in
registers, so a token's routing is loaded once, as vectors, and each column block then waits on one
round of loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["SHARE_STEP", "column_shares", "pick", "share_columns"]


#: the finest cut of a row between programs, in columns (a block of the decode launch shape)
SHARE_STEP = tl.constexpr(1024)


@triton.jit
def column_shares(n_rows, hidden, grid, BLOCK_H: tl.constexpr):
    """How many programs share one row's columns: the programs left over per row, at least 1 and
    at most the row's cuts (``cdiv(hidden, min(BLOCK_H, SHARE_STEP))``). Few rows (decode) spread each row
    over programs, whose loads are then in flight together; with at least ``grid`` rows each
    program takes whole rows."""
    STEP: tl.constexpr = BLOCK_H if BLOCK_H < SHARE_STEP else SHARE_STEP
    return tl.minimum(tl.maximum(grid // tl.maximum(n_rows, 1), 1), tl.cdiv(hidden, STEP))


@triton.jit
def share_columns(part, shares, hidden, BLOCK_H: tl.constexpr):
    """Columns ``[lo, hi)`` of share ``part`` of ``shares``: a run of whole cuts (the last one
    ending at ``hidden``); iterate ``range(lo, hi, BLOCK_H)`` and mask columns at ``hi``."""
    STEP: tl.constexpr = BLOCK_H if BLOCK_H < SHARE_STEP else SHARE_STEP
    cuts = tl.cdiv(hidden, STEP)
    lo = part * cuts // shares * STEP
    hi = tl.minimum((part + 1) * cuts // shares * STEP, hidden)
    return lo, hi


@triton.jit
def pick(v, kk, j):
    """Element ``j`` of the small vector ``v`` indexed by ``kk = tl.arange(0, len(v))`` (exact: one
    term plus zeros)."""
    return tl.sum(tl.where(kk == j, v, 0), axis=0)
