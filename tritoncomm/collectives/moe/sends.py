"""The dispatch's sending side, shared by the send kernel (``dispatch.py``) and the one-kernel dispatch
(``onekernel.py``): a dispatch kernel's start, and a program's work items of this rank's token rows
sent to the peers that hold their experts and laid out on this rank's own (``dispatch.py`` describes
the items, the tables they fill and the direct rows)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import heap_ptr, lamport_canonical, lamport_store, pdl_launch_dependents, pdl_wait, program_epoch
from .place import store_slots
from .route import expert_ids, own_slots, row_slots
from .shares import column_shares, pick, share_columns
from .wire import to_fp8

__all__ = ["launch_epoch", "send_items"]

@triton.jit
def launch_epoch(bases, rank, epochs_off):
    """A dispatch kernel's start: wait for the previous kernel (launched with PDL), let the next one
    start, and return this program's ``(epoch_ptr, epoch)`` (``program_epoch``) and the tables' half
    (the epoch's parity, int64). Also called by the one-kernel dispatch."""
    pdl_wait()
    pdl_launch_dependents()
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    return epoch_ptr, e, (e & 1).to(tl.int64)



@triton.jit
def send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr, sc_out_ptr,
               slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts, capacity, bases, rank, pid,
               grid, recv_base, peer_rows, ids_base, wtab_base, sc_base, routing, nn, hist, hist_blocks,
               DTYPE: tl.constexpr, WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr, COUNT_BAD: tl.constexpr,
               FROM_ROUTING: tl.constexpr, IDS_SENT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr,
               BLOCK_B: tl.constexpr, SUPER: tl.constexpr, PACKETS: tl.constexpr, out_off, sc_out_off, earlier,
               DIRECT: tl.constexpr, LOOKAHEAD: tl.constexpr = False, k_lo=0, k_hi=-1):
    """Program ``pid``'s work items ``pid + k * grid``, ``k_lo <= k < k_hi`` (``k_hi = -1``: every
    one from ``k_lo``), of this rank's ``n_tokens`` rows (module docstring): the routing
    to the peers with each row's first item, the columns to each peer that holds one of the row's
    experts (row ``(rank - (rank > d)) * peer_rows + t`` of its receive buffer) and into the row's
    slots on this rank (``route.own_slots``: from ``routing`` / ``nn`` with ``FROM_ROUTING``, else
    from the route kernel's rows of the local ids table and of ``hist``). With ``COUNT_BAD`` each
    row's first item adds its out-of-range ids to ``bad[0]``; with ``IDS_SENT`` (the route kernel's
    work, or the one-kernel dispatch's copies) the ids do not go out again. With ``PACKETS`` (the
    one-kernel dispatch without a barrier) the receive buffer and ``wtab_base`` are Lamport buffers
    (``kernels/lamport.py``), and the weights go, with the row's first item, only to the peers that
    get the row. Every value sent or laid out is ``lamport_canonical`` on every path (-0.0 as +0.0;
    a weight at the fp32 sentinel as -0.0), so the bits never depend on the path. Also called by
    the one-kernel dispatch (``onekernel.py``). With ``DIRECT`` (after the route kernel and its
    barrier) a row goes to each peer ``d`` straight into its first kept slot there (row ``at`` of the
    expert buffer at heap offset ``out_off``, its scales at ``sc_out_off``; ``route.row_slots`` with
    ``earlier``: per expert, the entries of the sources before this rank in its owner's order), and
    to no peer where it keeps no slot. With ``LOOKAHEAD`` an item's first column block is loaded
    before its routing, and each next block before the stores of the one before it: two rounds of
    loads in flight instead of one."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1  # scale groups per column block
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    shares = column_shares(n_tokens, hidden, grid, BLOCK_H)
    own_ids = heap_ptr(bases, rank, ids_base, tl.int32) + tl.cast(rank * max_tokens, tl.int64) * TOP_K
    items = n_tokens * shares
    for item in range(pid + k_lo * grid, tl.where(k_hi < 0, items, tl.minimum(items, pid + k_hi * grid)), grid):
        t = item // shares
        first = item % shares == 0  # the item that also sends the token's routing
        t64 = tl.cast(t, tl.int64)
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        if LOOKAHEAD:  # the first block's loads in flight with the routing's
            ahead = tl.load(x_ptr + t64 * x_stride + lo + cols, mask=lo + cols < hidden, other=0.0,
                            eviction_policy="evict_first")
        ids, bad = expert_ids(ids_ptr + t64 * ids_s0 + kk * ids_s1, km, num_experts)
        if COUNT_BAD:
            n_bad = tl.sum(bad.to(tl.int32))
            if first and n_bad > 0:
                tl.atomic_add(bad_ptr, n_bad.to(tl.int64))
        owner = tl.where(km & (ids >= 0), ids // LOCAL, -1)
        row = tl.cast(rank * max_tokens + t, tl.int64)
        # the routing goes out with the row's first item only (masked stores)
        wt = lamport_canonical(tl.load(w_ptr + t64 * w_s0 + kk * w_s1, mask=km, other=0.0).to(tl.float32))
        fm = km & first
        tl.store(wts_ptr + t * TOP_K + kk, wt, mask=fm)
        for d in tl.static_range(WORLD):
            if d != rank:
                if not IDS_SENT:
                    tl.store(heap_ptr(bases, d, ids_base + row * TOP_K * 4, tl.int32, ALIGNED=False) + kk, ids,
                             mask=fm)
                if PACKETS:  # row (rank - (rank > d)) * peer_rows + t, to the peers that get the row
                    prow = tl.cast(rank - (rank > d).to(tl.int32), tl.int64) * peer_rows + t64
                    lamport_store(heap_ptr(bases, d, wtab_base + prow * TOP_K * 4, tl.float32, ALIGNED=False) + kk,
                                  wt, mask=fm & (tl.sum((owner == d).to(tl.int32)) > 0))
                else:
                    tl.store(heap_ptr(bases, d, wtab_base + row * TOP_K * 4, tl.float32, ALIGNED=False) + kk, wt,
                             mask=fm)
        if DIRECT:  # every entry's slot on its owner (own entries: no earlier source)
            at_all = row_slots(own_ids, hist, ids, kk, t, n_tokens * TOP_K, earlier, rank * hist_blocks,
                               WORLD * hist_blocks + rank * tl.cdiv(hist_blocks, SUPER), capacity, LOCAL, TOP_K,
                               BLOCK_E, BLOCK_X, BLOCK_B, SUPER)
            at = tl.where(owner == rank, at_all, -1)
        else:
            at = own_slots(ids, kk, t, rank, capacity, routing, nn, own_ids, hist, n_tokens * TOP_K, hist_blocks,
                           FROM_ROUTING, WORLD, LOCAL, TOP_K, BLOCK_E, BLOCK_X, BLOCK_B, SUPER)
            at_all = tl.where(owner >= 0, 0, -1)  # a peer gets the row wherever it has an entry
        tl.store(slot_ptr + row * TOP_K + kk, at, mask=fm & (owner == rank))
        tl.store(owner_ptr + t * TOP_K + kk, owner, mask=fm)
        tl.store(row_ptr + t * TOP_K + kk, at, mask=fm)
        to_peers = tl.sum(((owner >= 0) & (owner != rank) & (at_all >= 0)).to(tl.int32)) > 0
        if to_peers | (tl.sum((at >= 0).to(tl.int32)) > 0):
            for c in range(lo, hi, BLOCK_H):
                m = c + cols < hidden
                if LOOKAHEAD:  # this block's loads were issued one step up; the next block's go out here
                    v = ahead
                    nxt = c + BLOCK_H
                    ahead = tl.load(x_ptr + t64 * x_stride + nxt + cols, mask=(nxt + cols < hidden) & (nxt < hi),
                                    other=0.0, eviction_policy="evict_first")
                else:
                    v = tl.load(x_ptr + t64 * x_stride + c + cols, mask=m, other=0.0,
                                eviction_policy="evict_first")  # read once (gather.py: cache hints)
                scale = 0.0
                if FP8:
                    v, scale = to_fp8(v)
                else:
                    v = lamport_canonical(v)
                for d in tl.static_range(WORLD):
                    kept_d = (owner == d) & (at_all >= 0)
                    if (d != rank) & (tl.sum(kept_d.to(tl.int32)) > 0):
                        if DIRECT:  # d's first kept slot (j order), times hidden after the pick: 16-byte vectors
                            prow = pick(at_all, kk, tl.min(tl.where(kept_d, kk, BLOCK_K))).to(tl.int64)
                            dst = heap_ptr(bases, d, out_off, DTYPE) + prow * hidden
                            sdst = heap_ptr(bases, d, sc_out_off, tl.float32) + prow * (hidden // 128)
                        else:  # row (rank - (rank > d)) * peer_rows + t of d's buffer: peers only
                            prow = tl.cast(rank - (rank > d).to(tl.int32), tl.int64) * peer_rows + t64
                            dst = heap_ptr(bases, d, recv_base, DTYPE) + prow * hidden  # 16-byte vectors
                            sdst = heap_ptr(bases, d, sc_base + prow * (hidden // 128) * 4, tl.float32,
                                            ALIGNED=False)
                        tl.store(dst + c + cols, v, mask=m)
                        if FP8:
                            tl.store(sdst + c // 128 + groups, scale, mask=c + groups * 128 < hidden)
                store_slots(out_ptr, sc_out_ptr, at, v, scale, c, hidden, TOP_K, BLOCK_K, BLOCK_H, FP8)

