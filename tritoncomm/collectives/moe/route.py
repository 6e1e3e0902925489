"""MoE routing: where each entry goes, computed by every rank from the routing every rank received;
and ``moe_route_kernel``, which sends every rank's routing to every rank before the send on
prefill-sized instances.

**Slot order.** The entries ``(source rank s, token t, j)`` of expert ``e``, owned by rank ``o = e //
local_experts``, get slots ``0, 1, ...`` in the order of their sources **relative to the owner**
(``o, o + 1, ..., o - 1`` modulo the world), then of ``(t, j)``; entries at or past ``capacity`` are
dropped. The owner's own entries come first, so their slots depend only on the owner's own routing:
the send kernel lays out the owner's own rows while the peers' rows cross the links, and only the
peers' rows wait for a barrier.

**Histograms.** At prefill sizes (the send and gather kernels) the count per expert of every block of
``BLOCK_E`` consecutive entries of every source is kept in the histogram table (row ``source *
hist_blocks + block``), and of every superblock of ``SUPER`` blocks (row ``world * hist_blocks +
source * super_blocks + superblock``). On instances of more than ``MoEShape.route_above`` entries
``moe_route_kernel`` runs before the send: it stores this rank's token count, its routing as int32
and its histogram rows into every rank's tables, so that after the send kernel's barrier (or, with
``MoEShape.route_barrier``, its own) every rank holds every rank's routing; on smaller ones the send
kernel counts and sends the rows. So nothing scans for its place: ``row_slots`` gives entry ``p = t *
TOP_K + j`` of source ``s``, of expert ``e``, in block ``b = t * TOP_K // BLOCK_E``, the slot

    (entries of ``e`` in the sources before ``s`` in ``e``'s owner's order: their superblock rows,
    summed once per source by the caller, ``rows_sum``)
    + (entries of ``e`` in ``s``'s superblocks before ``b``'s and in ``b``'s superblock's blocks
    before ``b``: at most ``super_blocks + SUPER`` rows, ``BLOCK_B`` per load)
    + (entries of ``e`` among ``s``'s entries ``b * BLOCK_E .. p - 1``, counted in a window of
    ``2 * BLOCK_E`` entries, which holds the row: ``BLOCK_K <= BLOCK_E``).

The send kernel (``dispatch.py``) calls it for this rank's own rows (no earlier source) and, after
the route kernel, for the peers' rows it was sent; the gather kernel (``gather.py``) for the peers'
rows on smaller instances.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    barrier,
    epoch_commit,
    epoch_next,
    heap_ptr,
    pdl_launch_dependents,
    pdl_wait,
    program_epoch,
    stamp,
)
from ...kernels.launcher import Launcher
from ...kernels.memory import address_ptr

__all__ = ["ROUTED_STAGES", "copy_slots", "count_entries", "direct_earlier", "expert_ids", "launch_route",
           "moe_route_kernel", "own_slots", "row_slots", "rows_per_load", "rows_sum", "slot_loads", "slot_sums"]


@triton.jit
def expert_ids(ptr, mask, num_experts):
    """The expert ids at ``ptr`` (int32 or int64) as int32, -1 where masked off, "no expert" (-1) or
    out of ``[0, num_experts)``; and where they were out of range (checked before narrowing)."""
    raw = tl.load(ptr, mask=mask, other=-1)
    bad = mask & (raw != -1) & ((raw < 0) | (raw >= num_experts))
    return tl.where(bad, -1, raw).to(tl.int32), bad


#: Stage stamps per program of the traced routed dispatch (``TRACE``): the route kernel's started,
#: tables sent and barrier passed (0-2; without its barrier, stage 2 follows stage 1 at once), the
#: send kernel's started, rows sent, barrier passed and laid out (3-6); and, where the program's first
#: item of the peers' rows is laid out alone (not in pairs, packets or direct rows), that item's
#: start, its ``slot_of`` stored (its slots known), its first column block stored (the block loaded)
#: and its last stores issued (7-10; left as they were elsewhere).
ROUTED_STAGES = 11
_STAGES = tl.constexpr(ROUTED_STAGES)


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
def slot_loads(ids, hist, e, t, n_entries, block_row0, super_row0, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
               BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr, SUPER: tl.constexpr):
    """``row_slots``' one round of loads for row ``t`` (entries ``e``): the first ``BLOCK_B``
    superblock rows' and block rows' columns ``e`` and the window of ids. Issued before any of them
    is used, so a caller may issue another row's round before summing this one (``slot_sums``)."""
    b = t * TOP_K // BLOCK_E
    q = b // SUPER
    col = tl.maximum(e, 0)
    rb = tl.arange(0, BLOCK_B)
    sup = tl.load(hist + tl.cast(super_row0 + rb, tl.int64)[:, None] * BLOCK_X + col[None, :],
                  mask=(rb < q)[:, None], other=0)
    blk = tl.load(hist + tl.cast(block_row0 + q * SUPER + rb, tl.int64)[:, None] * BLOCK_X + col[None, :],
                  mask=(rb < b - q * SUPER)[:, None], other=0)
    pos = b * BLOCK_E + tl.arange(0, 2 * BLOCK_E)
    win = tl.load(ids + pos, mask=pos < n_entries, other=-1)
    return sup, blk, win


@triton.jit
def slot_sums(sup, blk, win, hist, e, kk, t, earlier, block_row0, super_row0, capacity, LOCAL: tl.constexpr,
              TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
              SUPER: tl.constexpr):
    """``row_slots`` from ``slot_loads``' round (rows past its ``BLOCK_B`` are loaded and summed
    here)."""
    p0 = t * TOP_K
    b = p0 // BLOCK_E
    q = b // SUPER
    n_blk = b - q * SUPER  # block rows of b's superblock before b
    col = tl.maximum(e, 0)
    pos = b * BLOCK_E + tl.arange(0, 2 * BLOCK_E)
    slot = tl.gather(earlier, col, 0) + tl.sum(sup, axis=0) + tl.sum(blk, axis=0)
    slot += _rows_at(hist, super_row0 + BLOCK_B, q - BLOCK_B, e, BLOCK_B, BLOCK_X)  # none below BLOCK_B + 1
    if SUPER > BLOCK_B:
        slot += _rows_at(hist, block_row0 + q * SUPER + BLOCK_B, n_blk - BLOCK_B, e, BLOCK_B, BLOCK_X)
    slot += tl.sum(((win[None, :] == e[:, None]) & (pos[None, :] < (p0 + kk)[:, None])).to(tl.int32), axis=1)
    keep = (e >= 0) & (slot < capacity)
    return tl.where(keep, (e % LOCAL) * capacity + slot, -1)


@triton.jit
def row_slots(ids, hist, e, kk, t, n_entries, earlier, block_row0, super_row0, capacity, LOCAL: tl.constexpr,
              TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
              SUPER: tl.constexpr):
    """Where row ``t``'s entries go (module docstring): per entry ``j`` (``e[j]`` its expert, ``kk``
    its lane), ``local expert * capacity + slot`` on the owner, or -1 (no expert, or dropped).
    ``ids``: the source's entries (``n_entries`` live); ``earlier``: per expert, the entries of the
    sources before this one in the owner's order (the same for every expert of ``e`` the caller
    keeps: callers use the slots of one owner's experts only); ``block_row0`` / ``super_row0``: the
    source's first block / superblock row of the histogram table ``hist``. The first ``BLOCK_B``
    superblock rows, the block rows and the window are loaded before any of them is summed: one
    round of loads per row, not one per table (``slot_loads``; rows past those, at more than
    ``BLOCK_B`` superblocks, are summed after, ``slot_sums``)."""
    sup, blk, win = slot_loads(ids, hist, e, t, n_entries, block_row0, super_row0, TOP_K, BLOCK_E, BLOCK_X, BLOCK_B,
                               SUPER)
    return slot_sums(sup, blk, win, hist, e, kk, t, earlier, block_row0, super_row0, capacity, LOCAL, TOP_K, BLOCK_E,
                     BLOCK_X, BLOCK_B, SUPER)


@triton.jit
def direct_earlier(hist, ntab, rank, hist_blocks, WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr, SUPER: tl.constexpr):
    """Per expert ``x`` of every rank ``o = x // LOCAL``, the entries of ``x`` in the sources before
    this rank in ``o``'s order (``o, o + 1, ..., rank - 1``; none for this rank's own experts): the
    ``earlier`` of ``row_slots`` for every owner at once, from every source's superblock rows and
    count (``ntab``). Used by the send kernel to place its rows in their peers' slots."""
    xs = tl.arange(0, BLOCK_X)
    o = xs // LOCAL
    super_blocks = tl.cdiv(hist_blocks, SUPER)
    acc = tl.zeros([BLOCK_X], dtype=tl.int32)
    for s in tl.static_range(WORLD):
        if s != rank:
            n_s = tl.load(ntab + s)
            mine = rows_sum(hist, WORLD * hist_blocks + s * super_blocks, tl.cdiv(tl.cdiv(n_s * TOP_K, BLOCK_E), SUPER),
                            BLOCK_B, BLOCK_X)
            # s comes before this rank in o's order
            acc += tl.where((s - o + WORLD) % WORLD < (rank - o + WORLD) % WORLD, mine, 0)
    return acc


@triton.jit
def copy_slots(routing, nn, e, kk, t, earlier, capacity, LOCAL: tl.constexpr, TOP_K: tl.constexpr):
    """``row_slots`` from a source's whole routing in registers (``routing``, positions ``nn``: the
    one-kernel dispatch): the entries of ``e`` before ``(t, j)`` in the source, counted directly."""
    p0 = t * TOP_K
    before = tl.sum(((routing[None, :] == e[:, None]) & (nn[None, :] < (p0 + kk)[:, None])).to(tl.int32), axis=1)
    slot = tl.gather(earlier, tl.maximum(e, 0), 0) + before
    return tl.where((e >= 0) & (slot < capacity), (e % LOCAL) * capacity + slot, -1)


@triton.jit
def own_slots(e, kk, t, rank, capacity, routing, nn, ids, hist, n_entries, hist_blocks, FROM_ROUTING: tl.constexpr,
              WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
              BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr, SUPER: tl.constexpr):
    """The slots of this rank's own row ``t`` on its own experts (-1 for entries elsewhere, dropped
    or with no expert): its own entries come first, so no other rank's routing is needed. From the
    routing in registers (``FROM_ROUTING``: ``copy_slots``) or from this rank's rows of the ids and
    histogram tables that ``moe_route_kernel`` wrote (``row_slots``)."""
    none = tl.zeros([BLOCK_X], dtype=tl.int32)
    if FROM_ROUTING:
        at = copy_slots(routing, nn, e, kk, t, none, capacity, LOCAL, TOP_K)
    else:
        at = row_slots(ids, hist, e, kk, t, n_entries, none, rank * hist_blocks,
                       WORLD * hist_blocks + rank * tl.cdiv(hist_blocks, SUPER), capacity, LOCAL, TOP_K, BLOCK_E,
                       BLOCK_X, BLOCK_B, SUPER)
    return tl.where((e >= 0) & (e // LOCAL == rank), at, -1)

@triton.jit
def count_entries(ids_ptr, ids_s0, ids_s1, first, n_entries, num_experts, N: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_X: tl.constexpr):
    """Entries per expert among this rank's entries ``first .. first + N - 1`` (below
    ``n_entries``; "no expert" and out-of-range ids not counted)."""
    i = first + tl.arange(0, N)
    e, _ = expert_ids(ids_ptr + (i // TOP_K).to(tl.int64) * ids_s0 + (i % TOP_K) * ids_s1, i < n_entries,
                      num_experts)
    return tl.histogram(e, BLOCK_X, mask=e >= 0)


@triton.jit(do_not_specialize=["rank", "n_tokens", "ids_s0", "ids_s1"])
def moe_route_kernel(ids_ptr, ids_s0, ids_s1, bad_ptr, n_tokens, max_tokens, num_experts, bases, rank, timeout,
                     diag_addr, flags_off, epochs_off, send_epochs_off, ids_off, ids_half, ntab_off, ntab_half,
                     hist_off, hist_half, hist_blocks, trace_ptr, sig, WORLD: tl.constexpr, TOP_K: tl.constexpr,
                     BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, SUPER: tl.constexpr, TRACE: tl.constexpr = False,
                     BARRIER: tl.constexpr = True):
    """This rank's routing counted and sent before the send kernel (module docstring), into the
    half of the coming send's epoch (read from the send channel's counter of program ``pid``, not
    committed): program 0 stores ``n_tokens`` into every rank's count table; program ``pid`` takes the
    tasks ``pid, pid + grid, ...`` of the ``n_blocks`` blocks (the block's ids as int32 into row
    ``rank * max_tokens * TOP_K + p`` of every rank's ids table, its ids out of range added to
    ``bad[0]``, its histogram into every rank's histogram table) and then of the superblocks (their
    histograms); then, with ``BARRIER``, barrier slot ``pid`` of its own channel. Once the kernel has
    ended on a rank, every rank's routing is in its tables (each peer program stored its part before
    arriving at the slot its counterpart waited on). Without ``BARRIER`` that holds once the send
    kernel's barrier is passed: a peer's send program arrives only after the peer's route kernel
    has ended (``pdl_wait``: its stores performed), so the rank's own rows may go out first. The
    half it writes in a peer was last read by that peer's dispatch and combine two launches back;
    this rank starts only after passing the previous dispatch's send barrier, which the peer reaches
    only after those kernels have ended. With ``TRACE`` each program stamps (``kernels.stamp``)
    stages 0-2 of ``ROUTED_STAGES`` into ``trace_ptr``. The barrier compares the call's signature
    ``sig`` (None: no check; ``dispatch.py``, "Call check"): where it differs, every source's count in
    this rank's count table becomes 0, so the send kernel lays out nothing from the peers."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    diag = address_ptr(diag_addr, tl.int64)
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    if TRACE:
        stamp(trace_ptr, pid * _STAGES)
    if BARRIER:  # the route channel's epoch: only its barrier uses it
        epoch_ptr, ep = program_epoch(bases, rank, epochs_off)
    half = (epoch_next(heap_ptr(bases, rank, send_epochs_off, tl.uint32) + pid) & 1).to(tl.int64)
    row0 = tl.cast(rank * max_tokens, tl.int64) * TOP_K
    if pid == 0:
        for d in tl.static_range(WORLD):
            tl.store(heap_ptr(bases, d, ntab_off + half * ntab_half, tl.int32, ALIGNED=False) + rank, n_tokens)
    xs = tl.arange(0, BLOCK_X)
    n_entries = n_tokens * TOP_K
    n_blocks = tl.cdiv(n_entries, BLOCK_E)
    for u in range(pid, n_blocks + tl.cdiv(n_blocks, SUPER), grid):
        if u < n_blocks:
            i = u * BLOCK_E + tl.arange(0, BLOCK_E)
            live = i < n_entries
            e, bad = expert_ids(ids_ptr + (i // TOP_K).to(tl.int64) * ids_s0 + (i % TOP_K) * ids_s1, live,
                                num_experts)
            n_bad = tl.sum(bad.to(tl.int32))
            if n_bad > 0:
                tl.atomic_add(bad_ptr, n_bad.to(tl.int64))
            for d in tl.static_range(WORLD):
                tl.store(heap_ptr(bases, d, ids_off + half * ids_half, tl.int32) + row0 + i, e, mask=live)
            h = tl.histogram(e, BLOCK_X, mask=e >= 0)
            hrow = rank * hist_blocks + u
        else:
            h = count_entries(ids_ptr, ids_s0, ids_s1, (u - n_blocks) * SUPER * BLOCK_E, n_entries, num_experts,
                              SUPER * BLOCK_E, TOP_K, BLOCK_X)
            hrow = WORLD * hist_blocks + rank * tl.cdiv(hist_blocks, SUPER) + u - n_blocks
        for d in tl.static_range(WORLD):
            tl.store(heap_ptr(bases, d, hist_off + half * hist_half, tl.int32) + tl.cast(hrow, tl.int64) * BLOCK_X + xs,
                     h)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 1)
    if BARRIER:
        if not barrier(bases, rank, WORLD, flags_off, pid, ep, timeout, diag, sig):
            for s in tl.static_range(WORLD):
                tl.store(heap_ptr(bases, rank, ntab_off + half * ntab_half, tl.int32, ALIGNED=False) + s, 0)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 2)
    if BARRIER:
        epoch_commit(epoch_ptr, ep)


def launch_route(run: Launcher, comm, channel, send_channel, ids: torch.Tensor, bad: torch.Tensor, *,
                 max_tokens: int, num_experts: int, ids_off: int, ids_half: int, ntab_off: int, ntab_half: int,
                 hist_off: int, hist_half: int, hist_blocks: int, block_e: int, block_x: int, super_blocks: int,
                 num_warps: int, launch_opts: dict[str, bool | int], barrier: bool = True,
                 trace: torch.Tensor | None = None, sig: int | None = None) -> None:
    """Launch ``moe_route_kernel`` through ``run`` (its launcher: the send kernel's grid; ``channel``
    its own barrier slots, ``send_channel`` the send kernel's, whose coming epoch picks the half);
    ``barrier``: end with the route channel's barrier (else the send kernel's covers the routing, and
    the route channel needs no barrier slots).
    ``trace``: int64 ``[programs, ROUTED_STAGES, 2]`` for the stage stamps, or None; ``sig``: the call's
    signature, compared at the barrier, or None."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    run(ids, ids.stride(0), ids.stride(1), bad, ids.shape[0], max_tokens, num_experts, bases, rank, timeout, diag,
        channel.flags_off, channel.epochs_off, send_channel.epochs_off, ids_off, ids_half, ntab_off, ntab_half,
        hist_off, hist_half, hist_blocks, bad if trace is None else trace, sig, WORLD=world, TOP_K=ids.shape[1],
        BLOCK_E=block_e, BLOCK_X=block_x, SUPER=super_blocks, TRACE=trace is not None, BARRIER=barrier,
        num_warps=num_warps,
        **launch_opts)
