"""How the MoE kernels split rows of ``hidden`` columns over their programs.

A program that takes a whole row waits on one round of loads per column block, one after another;
at decode there are fewer rows than programs, so most programs would idle while a few walk their
rows' blocks. Work items are therefore (row, share of its column blocks): item ``i`` is row ``i //
shares`` and the ``i % shares``-th of ``shares`` runs of consecutive column blocks
(``share_columns``), and program ``pid`` takes items ``pid, pid + grid, ...``. A run's loop keeps
the constant step ``BLOCK_H``, as a whole row's does. Two kernels that split the same row count
the same way give the same item to the same program.

Where nothing pairs programs across ranks (the packet layouts, the latency combine's pushes),
several sources' items are dealt to the programs as one sequence: a source's items ``first, first +
grid, ...`` with ``first = dealt_first(...)``, so that at decode a program takes one source's share,
not one of every source's.

``pick(v, kk, j)`` reads element ``j`` of a token's small routing vector (ids, slots, weights) in
registers, so a token's routing is loaded once, as vectors, and each column block then waits on one
round of loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["column_shares", "dealt_first", "first_half", "pick", "program_items", "share_columns"]


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
def program_items(items, pid, grid):
    """How many of ``items`` are program ``pid``'s when they are dealt ``pid, pid + grid, ...``."""
    return tl.maximum(tl.cdiv(items - pid, grid), 0)


@triton.jit
def first_half(items, pid, grid):
    """How many of program ``pid``'s items ``pid, pid + grid, ...`` (of ``items``) form its first
    half, the larger one: what an interleaved program publishes at its half slot and what its
    counterparts use before their barrier (the send kernel's layout, ``MoEShape.interleave_from``;
    the throughput combine's final sums, ``combine_interleave_from``). Both sides compute it from
    the same count, so they agree without talking."""
    return (program_items(items, pid, grid) + 1) // 2


@triton.jit
def pick(v, kk, j):
    """Element ``j`` of the small vector ``v`` indexed by ``kk = tl.arange(0, len(v))`` (exact: one
    term plus zeros)."""
    return tl.sum(tl.where(kk == j, v, 0), axis=0)


@triton.jit
def dealt_first(pid, grid, before):
    """Program ``pid``'s first item of a source when the sources' items are dealt to ``grid``
    programs as one sequence and ``before`` items of earlier sources came first; a ``pid`` at or past
    ``grid`` (a program with none of this work) stays as it is."""
    return tl.where(pid < grid, (pid + grid - before % grid) % grid, pid)
