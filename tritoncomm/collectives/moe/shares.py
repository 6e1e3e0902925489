"""How the MoE kernels split rows of ``hidden`` columns over their programs.

A program that takes a whole row waits on one round of loads per column block, one after another;
at decode there are fewer rows than programs, so most programs would idle while a few walk their
rows' blocks; and with a few more rows than programs the busiest programs take one whole row more
than the others. Work items are therefore (row, share of its column blocks): item ``i`` is row ``i //
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
    """How many items one row's column blocks make (at most the number of blocks). Fewer rows than
    programs (decode): the programs left over per row, so that a row's loads are in flight together
    on several programs. More rows than programs: the count of shares ``s`` that gives the fewest
    columns to the busiest program, ``ceil(n_rows * s / grid) / s`` rows' worth, where each larger
    ``s`` taken cuts that by at least an eighth (more items cost more routing loads), so that the
    last round of items is not half idle while its programs take whole rows (384 rows on 264
    programs: two whole rows for the busiest program, or three half rows; 4096 rows: 16 whole rows,
    or 47 thirds, not worth it)."""
    blocks = tl.cdiv(hidden, BLOCK_H)
    n = tl.maximum(n_rows, 1)
    best = tl.minimum(tl.maximum(grid // n, 1), blocks)
    if n > grid:
        rounds = tl.cdiv(n, grid)  # items of the busiest program with whole rows (best == 1)
        for s in range(2, blocks + 1):
            r = tl.cdiv(n * s, grid)
            if 8 * r * best <= 7 * rounds * s:  # r / s rows' worth, at most 7/8 of rounds / best
                best = s
                rounds = r
    return best


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
