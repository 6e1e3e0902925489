"""MoE routing: where each entry goes, computed by every rank from the routing every rank received.

Every rank holds every rank's routing after the send kernel (``dispatch.py``), so every rank
computes the same slots without talking: the entries ``i = (source rank, token, j)`` (flattened in
that order) of expert ``e`` get slots ``0, 1, ...`` in order; entries at or past ``capacity`` are
dropped.

The send kernel also left the count per expert of every block of ``BLOCK_E`` consecutive entries of
every source (the histogram table, row ``source * hist_blocks + block``) and of every superblock of
``SUPER`` blocks (row ``world * hist_blocks + source * super_blocks + superblock``). So nothing
scans for its place: ``row_slots`` gives entry ``p = t * TOP_K + j`` of source ``s``, of expert
``e``, in block ``b = t * TOP_K // BLOCK_E``, the slot

    (entries of ``e`` in the earlier sources: their superblock rows, summed once per source by the
    caller, ``rows_sum``)
    + (entries of ``e`` in ``s``'s superblocks before ``b``'s and in ``b``'s superblock's blocks
    before ``b``: at most ``super_blocks + SUPER`` rows, ``BLOCK_B`` per load)
    + (entries of ``e`` among ``s``'s entries ``b * BLOCK_E .. p - 1``, counted in a window of
    ``2 * BLOCK_E`` entries, which holds the row: ``BLOCK_K <= BLOCK_E``).

The gather kernel (``gather.py``) calls it once per row it copies and writes what ``combine`` needs
from it.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["row_slots", "rows_per_load", "rows_sum"]


def rows_per_load(block_x: int) -> int:
    """Histogram rows per load (``BLOCK_B``): up to 16, at most 4096 values."""
    return max(1, min(16, 4096 // block_x))


@triton.jit
def rows_sum(hist, row0, n_rows, BLOCK_B: tl.constexpr, BLOCK_X: tl.constexpr):
    """The sum of the histogram rows ``row0 .. row0 + n_rows - 1``, ``BLOCK_B`` rows per load."""
    rb = tl.arange(0, BLOCK_B)
    xs = tl.arange(0, BLOCK_X)
    acc = tl.zeros([BLOCK_X], dtype=tl.int32)
    for r in range(0, n_rows, BLOCK_B):
        rows = tl.cast(row0 + r + rb, tl.int64)
        acc += tl.sum(tl.load(hist + rows[:, None] * BLOCK_X + xs[None, :], mask=(r + rb < n_rows)[:, None],
                              other=0), axis=0)
    return acc


@triton.jit
def _rows_at(hist, row0, n_rows, e, BLOCK_B: tl.constexpr, BLOCK_X: tl.constexpr):
    """Per element of ``e`` (expert ids, -1 for none), the sum of column ``e`` of the histogram rows
    ``row0 .. row0 + n_rows - 1`` (0 where ``e`` is -1), ``BLOCK_B`` rows per load."""
    rb = tl.arange(0, BLOCK_B)
    col = tl.maximum(e, 0)
    acc = tl.zeros(e.shape, dtype=tl.int32)
    for r in range(0, n_rows, BLOCK_B):
        rows = tl.cast(row0 + r + rb, tl.int64)
        acc += tl.sum(tl.load(hist + rows[:, None] * BLOCK_X + col[None, :], mask=(r + rb < n_rows)[:, None],
                              other=0), axis=0)
    return tl.where(e >= 0, acc, 0)


@triton.jit
def row_slots(ids, hist, e, kk, t, n_entries, earlier, block_row0, super_row0, capacity, LOCAL: tl.constexpr,
              TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
              SUPER: tl.constexpr):
    """Where row ``t``'s entries go (module docstring): per entry ``j`` (``e[j]`` its expert, ``kk``
    its lane), ``local expert * capacity + slot`` on the owner, or -1 (no expert, or dropped).
    ``ids``: the source's entries (``n_entries`` live); ``earlier``: per expert, the entries of the
    earlier sources; ``block_row0`` / ``super_row0``: the source's first block / superblock row of
    the histogram table ``hist``."""
    p0 = t * TOP_K
    b = p0 // BLOCK_E
    q = b // SUPER
    slot = tl.gather(earlier, tl.maximum(e, 0), 0)
    slot += _rows_at(hist, super_row0, q, e, BLOCK_B, BLOCK_X)
    slot += _rows_at(hist, block_row0 + q * SUPER, b - q * SUPER, e, BLOCK_B, BLOCK_X)
    pos = b * BLOCK_E + tl.arange(0, 2 * BLOCK_E)
    win = tl.load(ids + pos, mask=pos < n_entries, other=-1)
    slot += tl.sum(((win[None, :] == e[:, None]) & (pos[None, :] < (p0 + kk)[:, None])).to(tl.int32), axis=1)
    keep = (e >= 0) & (slot < capacity)
    return tl.where(keep, (e % LOCAL) * capacity + slot, -1)
