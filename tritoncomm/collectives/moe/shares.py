"""How the MoE kernels split rows of ``hidden`` columns over their programs.

A program that takes a whole row waits on one round of loads per column block, one after another;
at decode there are fewer rows than programs, so most programs would idle while a few walk their
rows' blocks. Work items are therefore (row, share of its column blocks): item ``i`` is row ``i //
shares`` and the ``i % shares``-th of ``shares`` runs of consecutive column blocks
(``share_columns``), and program ``pid`` takes items ``pid, pid + grid, ...``. A run's loop keeps
the constant step ``BLOCK_H``, as a whole row's does. Two kernels that split the same row count
the same way give the same item to the same program.

``pick(v, kk, j)`` reads element ``j`` of a token's small routing vector (ids, slots, weights) in
registers, so a token's routing is loaded once, as vectors, and each column block then waits on one
round of loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["column_shares", "pick", "share_columns"]


@triton.jit
def column_shares(n_rows, hidden, grid, BLOCK_H: tl.constexpr):
    """How many programs share one row's column blocks: the programs left over per row, at least
    1 and at most the number of blocks. Few rows (decode) spread each row's blocks over programs,
    whose loads are then in flight together; with at least ``grid`` rows each program takes whole
    rows."""
    return tl.minimum(tl.maximum(grid // tl.maximum(n_rows, 1), 1), tl.cdiv(hidden, BLOCK_H))


@triton.jit
def share_columns(part, shares, hidden, BLOCK_H: tl.constexpr):
    """Columns ``[lo, hi)`` of share ``part`` of ``shares``: a run of whole blocks (the last one
    ending at ``hidden``); iterate ``range(lo, hi, BLOCK_H)`` and mask columns at ``hidden``."""
    blocks = tl.cdiv(hidden, BLOCK_H)
    lo = part * blocks // shares * BLOCK_H
    hi = tl.minimum((part + 1) * blocks // shares * BLOCK_H, hidden)
    return lo, hi


@triton.jit
def pick(v, kk, j):
    """Element ``j`` of the small vector ``v`` indexed by ``kk = tl.arange(0, len(v))`` (exact: one
    term plus zeros)."""
    return tl.sum(tl.where(kk == j, v, 0), axis=0)
