"""MoE dispatch, step 2 of 3 (local: it reads only this rank's heap, after the send kernel).

Every rank holds every rank's routing after step 1, so every rank computes the same slots without
talking: the entries ``i = (source rank, token, j)`` (flattened in that order) of expert ``e`` get
slots ``0, 1, ...`` in order; entries at or past ``capacity`` are dropped.

Step 1 also left the count per expert of every block of ``BLOCK_E`` consecutive entries of every
source (the histogram table, row ``source * hist_blocks + block``) and of every superblock of
``SUPER`` blocks (row ``world * hist_blocks + source * super_blocks + superblock``). So no
program scans for its place: ``moe_route_kernel``'s program ``pid`` takes block ``b = pid %
hist_blocks`` of source ``s = pid // hist_blocks`` (if the source has entries there) and gives each
entry of expert ``e`` the slot

    (entries of ``e`` in every earlier block: the rows of the earlier sources' superblocks, of
    ``s``'s superblocks before ``b``'s and of ``b``'s superblock's blocks before ``b``, summed)
    + (entries of ``e`` before it in its block),

the second term from a stable sort of the block by ``(expert, position)``. Each entry is read
once, and each program sums at most ``world * super_blocks + SUPER`` rows.

For this rank's own entries it writes where ``combine`` will find the expert's output (``owner``,
and ``row = local expert * capacity + slot``; dropped entries keep ``owner = -1`` and are counted in
``bad[1]``). For the entries of this rank's experts it writes their row in the expert buffer, or -1
if dropped (``slot_of[entry]``, read by the gather kernel and the owner-side combine). Program 0
also writes this rank's experts' counts (``min(entries, capacity)``) from the sum of all live
superblock rows.

It reads the tables' half given by the parity of the epoch the send kernel's program 0 stored.

**Routing in the gather kernel** (``MoEShape.fused_route``, decode-sized instances: one kernel fewer
per dispatch). ``row_slots`` gives the entries of one row the same slots by the same rule, per row
instead of per block: entry ``p`` of source ``s`` (``p = t * TOP_K + j``) in block ``b = t * TOP_K //
BLOCK_E`` gets

    (entries of ``e`` in the earlier sources: their superblock rows, summed once per source by the
    caller) + (in ``s``'s superblocks before ``b``'s and in ``b``'s superblock's blocks before ``b``)
    + (entries of ``e`` among ``s``'s entries ``b * BLOCK_E .. p - 1``, counted in a window of
    ``2 * BLOCK_E`` entries, which holds the row: ``BLOCK_K <= BLOCK_E``),

so each row sums at most ``super_blocks + SUPER`` rows beside its window.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import heap_ptr, pdl_launch_dependents, pdl_wait
from ...kernels.launcher import Launcher

__all__ = ["launch_route", "moe_route_kernel", "row_slots", "rows_per_load", "rows_sum"]


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
    """Where row ``t``'s entries go (module docstring, "Routing in the gather kernel"): per entry
    ``j`` (``e[j]`` its expert, ``kk`` its lane), ``local expert * capacity + slot`` on the owner, or -1
    (no expert, or dropped). ``ids``: the source's entries (``n_entries`` live); ``earlier``: per
    expert, the entries of the earlier sources; ``block_row0`` / ``super_row0``: the source's first
    block / superblock row of the histogram table ``hist``."""
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


@triton.jit(do_not_specialize=["rank"])
def moe_route_kernel(owner_ptr, row_ptr, slot_ptr, counts_ptr, bad_ptr, max_tokens, capacity, hist_blocks, bases,
                     rank, epochs_off, ids_off, ids_half, ntab_off, ntab_half, hist_off, hist_half,
                     WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                     BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr, SUPER: tl.constexpr):
    """See the module docstring."""
    pid = tl.program_id(0)
    s = pid // hist_blocks
    b = pid % hist_blocks
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    ids = heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32)
    ntab = heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32)
    hist = heap_ptr(bases, rank, hist_off + parity * hist_half, tl.int32)
    xs = tl.arange(0, BLOCK_X)
    super_blocks = tl.cdiv(hist_blocks, SUPER)
    supers = WORLD * hist_blocks  # the first superblock row
    if pid == 0:
        total = tl.zeros([BLOCK_X], dtype=tl.int32)
        for s2 in range(WORLD):
            live = tl.cdiv(tl.cdiv(tl.load(ntab + s2) * TOP_K, BLOCK_E), SUPER)
            total += rows_sum(hist, supers + s2 * super_blocks, live, BLOCK_B, BLOCK_X)
        first = rank * LOCAL
        tl.store(counts_ptr + xs - first, tl.minimum(total, capacity), mask=(xs >= first) & (xs < first + LOCAL))
    n_s = tl.load(ntab + s) * TOP_K  # the source's live entries
    if b * BLOCK_E < n_s:
        q = b // SUPER
        base = rows_sum(hist, s * hist_blocks + q * SUPER, b - q * SUPER, BLOCK_B, BLOCK_X)
        base += rows_sum(hist, supers + s * super_blocks, q, BLOCK_B, BLOCK_X)
        for s2 in range(s):  # every superblock of the earlier sources
            live = tl.cdiv(tl.cdiv(tl.load(ntab + s2) * TOP_K, BLOCK_E), SUPER)
            base += rows_sum(hist, supers + s2 * super_blocks, live, BLOCK_B, BLOCK_X)
        eb = tl.arange(0, BLOCK_E)
        e = tl.load(ids + tl.cast(s * max_tokens * TOP_K + b * BLOCK_E, tl.int64) + eb, mask=b * BLOCK_E + eb < n_s,
                    other=-1)
        routed = e >= 0
        h = tl.histogram(e, BLOCK_X, mask=routed)
        # sorted by (expert, position): the entries of one expert in order, "no expert" last
        key = tl.sort(tl.where(routed, e, BLOCK_X) * BLOCK_E + eb)
        x = key // BLOCK_E  # the p-th sorted entry's expert ...
        k = key % BLOCK_E  # ... and its position in the block
        valid = x < BLOCK_X
        x = tl.minimum(x, BLOCK_X - 1)
        # slot = earlier blocks' entries of x + p - (the block's entries of experts before x)
        slot = tl.gather(base - (tl.cumsum(h, 0) - h), x, 0) + eb
        keep = valid & (slot < capacity)
        owner = x // LOCAL
        at = (x - owner * LOCAL) * capacity + slot
        if s == rank:
            tl.store(owner_ptr + b * BLOCK_E + k, tl.where(keep, owner, -1), mask=valid)
            tl.store(row_ptr + b * BLOCK_E + k, at, mask=keep)
            dropped = tl.sum((valid & ~keep).to(tl.int32))
            if dropped > 0:
                tl.atomic_add(bad_ptr + 1, dropped.to(tl.int64))
        tl.store(slot_ptr + tl.cast(s * max_tokens * TOP_K + b * BLOCK_E, tl.int64) + k, tl.where(keep, at, -1),
                 mask=valid & (owner == rank))


def launch_route(run: Launcher, comm, channel, owner: torch.Tensor, row: torch.Tensor,
                 slot_of: torch.Tensor, counts: torch.Tensor, bad: torch.Tensor, *, max_tokens: int, capacity: int,
                 local: int, top_k: int, ids_off: int, ids_half: int, ntab_off: int, ntab_half: int, hist_off: int,
                 hist_half: int, hist_blocks: int, block_e: int, block_x: int, super_blocks: int,
                 num_warps: int, launch_opts: dict[str, bool]) -> None:
    """Launch ``moe_route_kernel`` through ``run`` (its launcher: ``world * hist_blocks`` programs)."""
    bases, rank, world, _, _ = comm.kernel_args()
    run(owner, row, slot_of, counts, bad, max_tokens, capacity, hist_blocks, bases, rank, channel.epochs_off, ids_off,
        ids_half, ntab_off, ntab_half, hist_off, hist_half, WORLD=world, LOCAL=local, TOP_K=top_k, BLOCK_E=block_e,
        BLOCK_X=block_x, BLOCK_B=rows_per_load(block_x), SUPER=super_blocks, num_warps=num_warps, **launch_opts)
