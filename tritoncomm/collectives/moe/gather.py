"""MoE dispatch on instances of at most ``MoEShape.route_above`` routing entries, step 2 of 2 (local:
it reads this rank's heap, after the send kernel; larger instances lay out in the send kernel,
``lay_out_peers``).

``moe_gather_kernel`` lays out the tokens that **peers** sent this rank (the send kernel laid out the
rank's own rows, ``dispatch.py``): every live row ``(source s, token t)`` of every peer ``s`` (``t``
below the source's count) that has a kept entry on one of this rank's experts is read **once** from
the receive buffer and stored into each of its slots ``out[expert, slot]`` (at most ``TOP_K`` of
them; ``route.row_slots`` computes them), so the reads are one row per token and the writes one per
kept entry. With ``FP8`` the row's scales travel beside it.

Program ``pid`` takes, per peer in the order ``rank + 1, rank + 2, ...`` (the slot order of this
rank's experts, ``route.py``), the work items ``pid, pid + grid, ...``: row ``i // shares`` and the
``i % shares``-th run of its column blocks (``shares.py``; at decode a row's blocks spread over
programs). Every item computes its row's slots; each program sums the sources' superblock rows as it
goes, starting from this rank's own. A row's first item writes, for the entries of this rank's
experts, their expert-buffer row, or -1 if dropped (``slot_of``, read by the owner-side combine).
Program 0 writes this rank's experts' counts (``min(entries, capacity)``), adds the entries dropped
on them (past ``capacity``) to ``bad[1]``, then copies the two problem counters into host-mapped
words, which the host reads without synchronising.

It reads the tables' half given by the parity of the epoch the send kernel's program 0 stored.
Peer ``s``'s rows are rows ``(s - (s > rank)) * max_tokens + t`` of the receive buffer.

**Cache hints.** Data the MoE kernels touch once goes around the L2's keep set: the rows stored into
the expert slots are streaming stores (``.cs``), and the received rows of the plain receive buffer
(rows that arrive as Lamport packets are polled volatile instead), the tokens (``dispatch.py``) and
the expert outputs (``combine.py``) are loaded evict-first (the run that set it: ``docs/moe.md``,
"Where the defaults come from").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    heap_ptr,
    pdl_launch_dependents,
    pdl_wait,
    pow2_at_least,
)
from ...kernels.launcher import Launcher
from ...kernels.memory import address_ptr
from ...kernels.trace import stamp
from .header import size_of, store_header
from .place import place_item, place_packets, place_pair
from .route import row_slots, rows_per_load, rows_sum, slot_loads, slot_sums
from .shares import column_shares, first_half, pick

__all__ = ["finish_counts", "launch_gather", "lay_out_items", "lay_out_peers", "moe_gather_kernel", "no_counts"]


@triton.jit
def no_counts(counts_ptr, header_ptr, half, LOCAL: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_W: tl.constexpr):
    """Program 0 of a dispatch whose call check found a different call: every local expert's count 0
    (no row of the expert buffer is the call's, though this rank's own rows may have been laid out)
    and a header of no tokens, so that the combine after it moves nothing and waits for nobody."""
    xs = tl.arange(0, BLOCK_X)
    tl.store(counts_ptr + xs, tl.zeros([BLOCK_X], tl.int32), mask=xs < LOCAL)
    store_header(header_ptr, tl.zeros([BLOCK_W], tl.int32), half, BLOCK_W)


@triton.jit
def finish_counts(counts_ptr, bad_ptr, bad_host_addr, totals, capacity, rank, bad_ids, LOCAL: tl.constexpr,
                  BLOCK_X: tl.constexpr):
    """Program 0, last: this rank's experts' counts (``totals``: every source's entries per expert),
    ``bad_ids`` and the entries dropped on this rank's experts added to ``bad``, both counters
    copied into the host-mapped words where they changed since the last copy (``bad[2:4]``: the
    counters as last copied; both only grow, so a call without bad ids or drops writes no host
    memory). Also called by the one-kernel dispatch."""
    xs = tl.arange(0, BLOCK_X)
    mine = (xs >= rank * LOCAL) & (xs < rank * LOCAL + LOCAL)
    tl.store(counts_ptr + xs - rank * LOCAL, tl.minimum(totals, capacity), mask=mine)
    dropped = tl.sum(tl.where(mine, tl.maximum(totals - capacity, 0), 0)).to(tl.int64)
    two = tl.arange(0, 2)
    now = tl.load(bad_ptr + two) + tl.where(two == 0, bad_ids, dropped).to(tl.int64)
    tl.store(bad_ptr + two, now)
    changed = now != tl.load(bad_ptr + 2 + two)
    tl.store(address_ptr(bad_host_addr, tl.int64) + two, now, mask=changed)
    tl.store(bad_ptr + 2 + two, now, mask=changed)


@triton.jit
def lay_out_items(out_ptr, sc_out_ptr, slot_ptr, recv, sc, ids, hist, hist_blocks, max_tokens, capacity, hidden, rank,
                  s, n_s, shares, earlier, start, stop, step, pw, wtab, timeout, diag, WORLD: tl.constexpr,
                  LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                  FP8: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
                  SUPER: tl.constexpr, PACKETS: tl.constexpr, DIRECT: tl.constexpr, trace_ptr=0, tslot=-1,
                  TRACE: tl.constexpr = False):
    """Items ``start, start + step, ...`` below ``stop`` of source ``s``'s rows (``n_s`` of them,
    ``shares`` items each; ``earlier``: per expert, the entries of the sources before it in this
    rank's order), one at a time, as ``lay_out_peers`` lays them out (from the receive buffer, as
    packets with ``PACKETS``, or from the row's first kept slot with ``DIRECT``). With ``TRACE`` and
    ``tslot >= 0`` the first item stamps stage ``tslot`` at its start and ``place_item``'s after it."""
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    super_blocks = tl.cdiv(hist_blocks, SUPER)
    peer_row = (s - (s > rank).to(tl.int32)) * max_tokens  # the source's first row in the receive buffer
    src_ids = ids + s * max_tokens * TOP_K  # the source's entries, block rows and superblock rows
    block_row0 = s * hist_blocks
    super_row0 = WORLD * hist_blocks + s * super_blocks
    for item in range(start, stop, step):
        t = item // shares
        first_here = item == start
        if TRACE and not PACKETS and not DIRECT:
            if first_here & (tslot >= 0):
                stamp(trace_ptr, tslot)
        i0 = (s * max_tokens + t) * TOP_K
        e = tl.load(ids + i0 + kk, mask=km, other=-1)
        at = row_slots(src_ids, hist, e, kk, t, n_s * TOP_K, earlier, block_row0, super_row0, capacity, LOCAL,
                       TOP_K, BLOCK_E, BLOCK_X, BLOCK_B, SUPER)
        if PACKETS:
            place_packets(out_ptr, sc_out_ptr, slot_ptr, ids, wtab, recv, sc, pw, e, at, i0, item, shares, rank, s,
                          t, peer_row + t, hidden, timeout, diag, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
        elif DIRECT:  # the row came into its first kept slot here
            kept = (e >= 0) & (e // LOCAL == rank) & (at >= 0)
            j0 = tl.min(tl.where(kept, kk, BLOCK_K))
            place_item(out_ptr, sc_out_ptr, slot_ptr, out_ptr, sc_out_ptr, e, at, i0, item, shares, rank,
                       pick(at, kk, j0), hidden, j0, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
        else:
            place_item(out_ptr, sc_out_ptr, slot_ptr, recv, sc, e, at, i0, item, shares, rank, peer_row + t,
                       hidden, -1, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, trace_ptr, tl.where(first_here, tslot, -1),
                       TRACE)


@triton.jit
def lay_out_peers(out_ptr, sc_out_ptr, slot_ptr, recv, sc, ids, ntab, hist, hist_blocks, max_tokens, capacity, hidden,
                  rank, pid, grid, pw, wtab, timeout, diag, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                  TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr, SUPER: tl.constexpr,
                  PACKETS: tl.constexpr, BLOCK_W: tl.constexpr, DIRECT: tl.constexpr = False,
                  PAIRS: tl.constexpr = False, trace_ptr=0, tslot=-1, TRACE: tl.constexpr = False,
                  REST: tl.constexpr = False):
    """Program ``pid``'s items of every peer's rows (module docstring), laid out from the receive
    buffer ``recv`` (scales ``sc``) with the slots from the tables ``ids``, ``ntab`` and ``hist``;
    with ``DIRECT`` from the row's first kept slot on this rank (in ``j`` order), where the source
    stored it, into its other slots.
    Returns every source's entries per expert on program 0 (the others skip the last source's count,
    which no row of theirs needs). Also called by the send kernel after its barrier when
    the route kernel ran (``dispatch.py``); with ``PACKETS`` (no barrier) ``recv``, ``sc`` and ``pw``
    are Lamport buffers, polled row by row (``place_packets``: the weights go from ``pw`` into
    ``wtab``). With ``PAIRS`` (not ``PACKETS``), where a source gives every program two whole rows
    or more (no column shares, at least ``2 * grid`` rows), the program takes that source's rows two
    at a time (``place_pair``). With ``TRACE`` the program's first item taken alone (not with
    ``PACKETS`` or ``DIRECT``) stamps stage ``tslot`` at its start and ``place_item``'s after it.
    With ``REST`` (the interleaved send kernel, ``dispatch.py``) the program's first
    half of each source's items (``shares.first_half``) was laid out before: only the rest is."""
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    super_blocks = tl.cdiv(hist_blocks, SUPER)
    ws = tl.arange(0, BLOCK_W)
    sizes = tl.load(ntab + ws, mask=ws < WORLD, other=0)  # every source's count, one load
    # per expert, the entries of the sources before s in this rank's order: its own first
    earlier = rows_sum(hist, WORLD * hist_blocks + rank * super_blocks,
                       tl.cdiv(tl.cdiv(size_of(sizes, rank, BLOCK_W) * TOP_K, BLOCK_E), SUPER), BLOCK_B, BLOCK_X)
    for i in range(1, WORLD):
        s = (rank + i) % WORLD
        n_s = size_of(sizes, s, BLOCK_W)
        peer_row = (s - (s > rank).to(tl.int32)) * max_tokens  # the source's first row in the receive buffer
        # the source's entries per expert, for the sources after it (the last one's: program 0's totals)
        src_ids = ids + s * max_tokens * TOP_K  # the source's entries, block rows and superblock rows
        block_row0 = s * hist_blocks
        super_row0 = WORLD * hist_blocks + s * super_blocks
        n_super = tl.where((i < WORLD - 1) | (pid == 0), tl.cdiv(tl.cdiv(n_s * TOP_K, BLOCK_E), SUPER), 0)
        mine = rows_sum(hist, super_row0, n_super, BLOCK_B, BLOCK_X)
        shares = column_shares(n_s, hidden, grid, BLOCK_H)
        start = pid  # this program's first item left to lay out
        if REST:
            start = pid + first_half(n_s * shares, pid, grid) * grid
        # with PAIRS, whole rows two at a time (items start + 2 k grid and the one after): each of
        # their rounds of loads (ids, slots, columns) in flight together
        pair_end = 0  # rows below it go two at a time, the items from rest_start one at a time
        rest_start = start
        if PAIRS and not PACKETS:
            pair_end = tl.where((shares == 1) & (n_s >= 2 * grid), n_s, 0)  # every program has two rows or more
            rest_start = start + pair_end * shares
        for item in range(start, pair_end, 2 * grid):
            two = item + grid < n_s
            t2 = tl.where(two, item + grid, item)
            i0 = (s * max_tokens + item) * TOP_K
            i02 = (s * max_tokens + t2) * TOP_K
            e = tl.load(ids + i0 + kk, mask=km, other=-1)
            e2 = tl.load(ids + i02 + kk, mask=km & two, other=-1)
            sup, blk, win = slot_loads(src_ids, hist, e, item, n_s * TOP_K, block_row0, super_row0, TOP_K, BLOCK_E,
                                       BLOCK_X, BLOCK_B, SUPER)
            sup2, blk2, win2 = slot_loads(src_ids, hist, e2, t2, n_s * TOP_K, block_row0, super_row0, TOP_K, BLOCK_E,
                                          BLOCK_X, BLOCK_B, SUPER)
            at = slot_sums(sup, blk, win, hist, e, kk, item, earlier, block_row0, super_row0, capacity, LOCAL, TOP_K,
                           BLOCK_E, BLOCK_X, BLOCK_B, SUPER)
            at2 = slot_sums(sup2, blk2, win2, hist, e2, kk, t2, earlier, block_row0, super_row0, capacity, LOCAL,
                            TOP_K, BLOCK_E, BLOCK_X, BLOCK_B, SUPER)
            if DIRECT:  # each row came into its first kept slot here
                j0 = tl.min(tl.where((e >= 0) & (e // LOCAL == rank) & (at >= 0), kk, BLOCK_K))
                j02 = tl.min(tl.where((e2 >= 0) & (e2 // LOCAL == rank) & (at2 >= 0), kk, BLOCK_K))
                place_pair(out_ptr, sc_out_ptr, slot_ptr, out_ptr, sc_out_ptr, e, at, i0, pick(at, kk, j0), j0, e2,
                           at2, i02, pick(at2, kk, j02), j02, two, rank, hidden, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
            else:
                place_pair(out_ptr, sc_out_ptr, slot_ptr, recv, sc, e, at, i0, peer_row + item, -1, e2, at2, i02,
                           peer_row + t2, -1, two, rank, hidden, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
        lay_out_items(out_ptr, sc_out_ptr, slot_ptr, recv, sc, ids, hist, hist_blocks, max_tokens, capacity, hidden,
                      rank, s, n_s, shares, earlier, rest_start, n_s * shares, grid, pw, wtab, timeout, diag, WORLD,
                      LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, BLOCK_E, BLOCK_X, BLOCK_B, SUPER, PACKETS, DIRECT,
                      trace_ptr, tl.where((i == 1) & (rest_start == pid), tslot, -1), TRACE and not REST)
        earlier += mine
    return earlier


@triton.jit(do_not_specialize=["rank"])
def moe_gather_kernel(out_ptr, sc_out_ptr, slot_ptr, counts_ptr, bad_ptr, bad_host_addr, hidden, max_tokens,
                      capacity, hist_blocks, bases, rank, epochs_off, recv_off, recv_half, ids_off, ids_half,
                      ntab_off, ntab_half, sc_off, sc_half, hist_off, hist_half, header_ptr, WORLD: tl.constexpr,
                      LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                      FP8: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
                      SUPER: tl.constexpr, BLOCK_W: tl.constexpr, PAIRS: tl.constexpr = False):
    """See the module docstring. ``PAIRS``: whole rows two at a time (``lay_out_peers``)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty  # e4m3 with FP8, else the tokens' dtype
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    totals = lay_out_peers(out_ptr, sc_out_ptr, slot_ptr, heap_ptr(bases, rank, recv_off + parity * recv_half, DTYPE),
                           heap_ptr(bases, rank, sc_off + parity * sc_half, tl.float32),
                           heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32),
                           heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32),
                           heap_ptr(bases, rank, hist_off + parity * hist_half, tl.int32), hist_blocks, max_tokens,
                           capacity, hidden, rank, pid, grid, 0, 0, 0, 0, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8,
                           BLOCK_E, BLOCK_X, BLOCK_B, SUPER, False, BLOCK_W, False, PAIRS)
    if pid == 0:
        finish_counts(counts_ptr, bad_ptr, bad_host_addr, totals, capacity, rank, 0, LOCAL, BLOCK_X)
        ws = tl.arange(0, BLOCK_W)
        ntab = heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32)
        store_header(header_ptr, tl.load(ntab + ws, mask=ws < WORLD, other=0), parity, BLOCK_W)


def launch_gather(run: Launcher, comm, channel, out: torch.Tensor, scales: torch.Tensor | None,
                  slot_of: torch.Tensor, counts: torch.Tensor, bad: torch.Tensor, bad_host_addr: int, *,
                  max_tokens: int, capacity: int, local: int, top_k: int, recv_off: int, recv_half: int, ids_off: int,
                  ids_half: int, ntab_off: int, ntab_half: int, sc_off: int, sc_half: int, hist_off: int,
                  hist_half: int, hist_blocks: int, block_e: int, block_x: int, super_blocks: int, block_h: int,
                  num_warps: int, launch_opts: dict[str, bool | int], header: torch.Tensor,
                  pairs: bool = False) -> None:
    """Launch ``moe_gather_kernel`` through ``run`` (its launcher: a 1-D grid); ``header``: what
    ``combine`` reads (``header.py``); ``pairs``: whole rows two at a time."""
    bases, rank, world, _, _ = comm.kernel_args()
    fp8 = scales is not None
    run(out, scales if fp8 else out, slot_of, counts, bad, bad_host_addr, out.shape[-1], max_tokens, capacity,
        hist_blocks, bases, rank, channel.epochs_off, recv_off, recv_half, ids_off, ids_half, ntab_off, ntab_half,
        sc_off, sc_half, hist_off, hist_half, header, WORLD=world, LOCAL=local, TOP_K=top_k,
        BLOCK_K=pow2_at_least(top_k), BLOCK_H=block_h, FP8=fp8, BLOCK_E=block_e,
        BLOCK_X=block_x, BLOCK_B=rows_per_load(block_x), SUPER=super_blocks, BLOCK_W=pow2_at_least(world),
        PAIRS=bool(pairs), num_warps=num_warps, **launch_opts)
