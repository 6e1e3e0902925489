"""Placing a received token row into its expert slots, shared by the gather kernel, the send kernel's
layout and the one-kernel dispatch: a row read once and stored once per kept entry (``gather.py``:
the order, the tables and the cache hints)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import aligned_runs, lamport_poll, lamport_poll_from, lamport_reset, lamport_try
from ...kernels.trace import stamp
from .shares import pick, share_columns

__all__ = ["place_item", "place_packets", "place_pair", "store_slots"]

@triton.jit
def store_slots(out_ptr, sc_out_ptr, at, v, scale, c, hidden, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Columns ``c ..`` of one token row (``v``: ``[G, GW]`` values, ``scale``: ``[G]`` with ``FP8``)
    stored into each of its kept slots ``at`` (expert-buffer rows, -1 for none). Also called by the
    send kernels for the rank's own rows."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1  # scale groups per column block
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    m = c + cols < hidden
    for j in tl.static_range(TOP_K):
        a = pick(at, kk, j)
        # times hidden after the pick: 16-byte stores (a pick's result has no known divisibility);
        # streaming (.cs): this kernel never reads them back (module docstring: cache hints)
        tl.store(out_ptr + a.to(tl.int64) * hidden + c + cols, v, mask=m & (a >= 0), cache_modifier=".cs")
        if FP8:
            tl.store(sc_out_ptr + a.to(tl.int64) * (hidden // 128) + c // 128 + groups, scale,
                     mask=(c + groups * 128 < hidden) & (a >= 0))



@triton.jit
def place_item(out_ptr, sc_out_ptr, slot_ptr, recv, sc, e, at, i0, item, shares, rank, recv_row, hidden, skip,
               LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
               FP8: tl.constexpr, trace_ptr=0, tslot=-1, TRACE: tl.constexpr = False):
    """One work item of a peer's row (entries ``e``, slots ``at``; ``i0`` its first entry in the
    tables; row ``recv_row`` of ``recv``, the receive buffer or, for rows sent straight into their
    first slot, the expert buffer): the row's first item writes ``slot_of`` of the entries of this
    rank's experts; then the item's columns are read once and go into this rank's kept slots but
    entry ``skip``'s (-1: none; the slot the row came in). With ``TRACE`` and ``tslot >= 0`` the
    program stamps stages ``tslot + 1`` (``slot_of`` stored), ``+ 2`` (the first column block stored)
    and ``+ 3`` (the last stores issued) into ``trace_ptr``: each stamp follows a store that needed
    the loads before it. Also called by the one-kernel dispatch."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    on_me = (e >= 0) & (e // LOCAL == rank)  # entries of this rank's experts
    tl.store(slot_ptr + i0 + kk, at, mask=(kk < TOP_K) & (item % shares == 0) & on_me)
    if TRACE:
        if tslot >= 0:
            stamp(trace_ptr, tslot + 1)
    at = tl.where(on_me & (kk != skip), at, -1)
    if tl.sum((at >= 0).to(tl.int32), axis=0) > 0:
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        r64 = tl.cast(recv_row, tl.int64)
        for c in range(lo, hi, BLOCK_H):
            v = tl.load(recv + r64 * hidden + c + cols, mask=c + cols < hidden, eviction_policy="evict_first")
            scale = 0.0
            if FP8:
                scale = tl.load(sc + r64 * (hidden // 128) + c // 128 + groups, mask=c + groups * 128 < hidden)
            store_slots(out_ptr, sc_out_ptr, at, v, scale, c, hidden, TOP_K, BLOCK_K, BLOCK_H, FP8)
            if TRACE:
                if (tslot >= 0) & (c == lo):
                    stamp(trace_ptr, tslot + 2)
        if TRACE:
            if tslot >= 0:
                stamp(trace_ptr, tslot + 3)



@triton.jit
def place_pair(out_ptr, sc_out_ptr, slot_ptr, recv, sc, e, at, i0, row, skip, e2, at2, i02, row2, skip2, two, rank,
               hidden, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
               FP8: tl.constexpr):
    """``place_item`` for two whole rows of peers at once (the second only where ``two``): both
    rows' ``slot_of`` entries, then per column block both rows' loads before either's stores, so
    that a program with two rows waits on one round of loads per block, not two."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    on_me = (e >= 0) & (e // LOCAL == rank)
    on_me2 = (e2 >= 0) & (e2 // LOCAL == rank) & two
    tl.store(slot_ptr + i0 + kk, at, mask=km & on_me)
    tl.store(slot_ptr + i02 + kk, at2, mask=km & on_me2)
    at = tl.where(on_me & (kk != skip), at, -1)
    at2 = tl.where(on_me2 & (kk != skip2), at2, -1)
    any1 = tl.sum((at >= 0).to(tl.int32), axis=0) > 0
    any2 = tl.sum((at2 >= 0).to(tl.int32), axis=0) > 0
    if any1 | any2:
        r64 = tl.cast(row, tl.int64)
        r264 = tl.cast(row2, tl.int64)
        for c in range(0, hidden, BLOCK_H):
            m = c + cols < hidden
            v = tl.load(recv + r64 * hidden + c + cols, mask=m & any1, eviction_policy="evict_first")
            v2 = tl.load(recv + r264 * hidden + c + cols, mask=m & any2, eviction_policy="evict_first")
            scale = 0.0
            scale2 = 0.0
            if FP8:
                gm = c + groups * 128 < hidden
                scale = tl.load(sc + r64 * (hidden // 128) + c // 128 + groups, mask=gm & any1)
                scale2 = tl.load(sc + r264 * (hidden // 128) + c // 128 + groups, mask=gm & any2)
            store_slots(out_ptr, sc_out_ptr, at, v, scale, c, hidden, TOP_K, BLOCK_K, BLOCK_H, FP8)
            store_slots(out_ptr, sc_out_ptr, at2, v2, scale2, c, hidden, TOP_K, BLOCK_K, BLOCK_H, FP8)



@triton.jit
def place_packets(out_ptr, sc_out_ptr, slot_ptr, ids_tab, wtab, recv, sc, pw, e, at, i0, item, shares, rank, s, t,
                  recv_row, hidden, timeout, diag, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_H: tl.constexpr, FP8: tl.constexpr, LOOKAHEAD: tl.constexpr = False,
                  ROWS16: tl.constexpr = False):
    """``place_item`` for packets: one work item of source ``s``'s row ``t`` (entries ``e``, slots
    ``at``, ``i0`` its first entry in the tables; row ``recv_row`` of the packet buffers). The row's
    first item writes the source's ids and, for this rank's experts, ``slot_of``; if the row has an
    entry on this rank (kept or not: the sender does not know which are dropped) the first item
    polls its weights into ``wtab``, and the item polls its columns, stores them into the kept
    slots and resets every packet it read. The first look at the columns is issued before the weights
    are polled (two waits, one after the other, never in one loop: ``kernels/lamport.py``); with
    ``LOOKAHEAD`` each next block's first look is issued before this block's stores (a look, not a
    wait). ``ROWS16``: the receive rows start on 16-byte boundaries (``aligned_runs``). Called by
    the one-kernel dispatch and, with routed packets, the send kernel."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    first = item % shares == 0
    on_me = (e >= 0) & (e // LOCAL == rank)  # entries of this rank's experts
    tl.store(ids_tab + i0 + kk, e, mask=km & first)
    tl.store(slot_ptr + i0 + kk, at, mask=km & first & on_me)
    if tl.sum(on_me.to(tl.int32), axis=0) > 0:  # the source sent the row here
        r64 = tl.cast(recv_row, tl.int64)
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        row = recv + r64 * hidden
        v, miss = lamport_try(row + lo + cols, lo + cols < hidden)  # in flight while the weights are polled
        if first:
            wv = lamport_poll(pw + r64 * TOP_K + kk, km, s, t, rank, timeout, diag)
            tl.store(wtab + i0 + kk, wv, mask=km)
            lamport_reset(pw + r64 * TOP_K + kk, km)
        at = tl.where(on_me, at, -1)
        for c in range(lo, hi, BLOCK_H):
            m = c + cols < hidden
            if not LOOKAHEAD:
                if c != lo:
                    v, miss = lamport_try(row + c + cols, m)
            v = lamport_poll_from(v, miss, row + c + cols, m, s, t, rank, timeout, diag)
            if LOOKAHEAD:  # the next block's first look, in flight during this block's stores
                nxt = c + BLOCK_H
                v_next, miss = lamport_try(row + nxt + cols, (nxt + cols < hidden) & (nxt < hi))
            scale = 0.0
            if FP8:
                gm = c + groups * 128 < hidden
                scale = lamport_poll(sc + r64 * (hidden // 128) + c // 128 + groups, gm, s, t, rank, timeout, diag)
                lamport_reset(sc + r64 * (hidden // 128) + c // 128 + groups, gm)
            store_slots(out_ptr, sc_out_ptr, at, v, scale, c, hidden, TOP_K, BLOCK_K, BLOCK_H, FP8)
            lamport_reset(aligned_runs(row, c + cols, GW, ROWS16), m)
            if LOOKAHEAD:
                v = v_next

