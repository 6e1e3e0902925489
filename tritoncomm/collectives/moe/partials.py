"""The MoE combine's partial sums (``combine.py`` states the numerics): a rank's partial of a token
computed from its expert buffer, pushed to the token's home or kept, and every token's partials
added in rank order."""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import heap_ptr, lamport_canonical, lamport_poll, lamport_reset, lamport_store, round_to
from .shares import column_shares, pick, share_columns

__all__ = ["THROUGHPUT_STEP", "canonical_partial", "final_item", "own_item", "push_item", "sum_tokens",
           "throughput_step", "weighted_rows"]

#: Columns one step of the throughput mode sums, at most. Its items are wider
#: (``MoEShape.throughput_block_h``, 4096 on H200s) and are summed this many columns at a time: a
#: 4096-column step spills at the prefill shape's register cap on Triton 3.8 and 3.9. The columns
#: are independent, so the step changes no bit of the result.
THROUGHPUT_STEP = 2048


@triton.constexpr_function
def throughput_step(block):
    """The columns a step of ``block``-column items sums: ``block``, at most ``THROUGHPUT_STEP``."""
    return min(block, THROUGHPUT_STEP)


@triton.jit
def canonical_partial(summed, DTYPE: tl.constexpr):
    """A rank's partial as it is added: rounded to the dtype, -0.0 as +0.0 (a Lamport packet's rule,
    applied in both modes so that they agree bit for bit)."""
    return lamport_canonical(round_to(summed, DTYPE))


@triton.jit
def weighted_rows(ybuf, rows, wt, c, hidden, m, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    """Columns ``c ..`` (where ``m``) of ``sum_j wt[j] * ybuf[rows[j]]`` in fp32 over the entries
    ``j`` with ``rows[j] >= 0``, in ``j`` order, each product rounded before its add (the launch
    turns contraction off)."""
    cols = tl.arange(0, BLOCK_H)
    kk = tl.arange(0, BLOCK_K)
    summed = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        on_me = pick(rows, kk, j) >= 0
        # times hidden after the pick: 16-byte loads (a pick's result has no known divisibility);
        # evict-first: each expert row is read once (gather.py: cache hints)
        y = tl.load(ybuf + pick(rows, kk, j).to(tl.int64) * hidden + c + cols, mask=m & on_me, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        summed += tl.where(on_me, pick(wt, kk, j) * y, 0.0)
    return summed


@triton.jit
def final_item(out_ptr, w_ptr, owner_ptr, row_ptr, ybuf, part, n_tokens, hidden, max_tokens, rank, item, grid,
                WORLD: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HT: tl.constexpr,
                OWN_HERE: tl.constexpr = False):
    """Throughput mode: item ``item`` of this rank's own tokens (``column_shares(n_tokens)`` of
    ``BLOCK_HT`` columns) summed in rank order, each peer's partial read from the partials buffer
    ``part``, its own read back from ``out`` (where ``own_item`` stored it) or, with ``OWN_HERE``
    (the chunked mode), computed here from the expert buffer ``ybuf`` as ``own_item`` computes it;
    the result into ``out``."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    STEP: tl.constexpr = throughput_step(BLOCK_HT)
    wide = tl.arange(0, STEP)
    wshares = column_shares(n_tokens, hidden, grid, BLOCK_HT)
    t = item // wshares
    owner = tl.load(owner_ptr + t * TOP_K + kk, mask=km, other=-1)
    if OWN_HERE:
        row = tl.load(row_ptr + t * TOP_K + kk, mask=km, other=-1)  # -1 unless kept here
        wt = tl.load(w_ptr + t * TOP_K + kk, mask=km, other=0.0)
    lo, hi = share_columns(item % wshares, wshares, hidden, BLOCK_HT)
    for c in range(lo, hi, STEP):
        m = c + wide < hidden
        if OWN_HERE:
            own = canonical_partial(weighted_rows(ybuf, row, wt, c, hidden, m, TOP_K, BLOCK_K, STEP),
                           DTYPE).to(tl.float32)
        else:
            own = tl.load(out_ptr + tl.cast(t, tl.int64) * hidden + c + wide, mask=m, other=0.0).to(tl.float32)
        acc = tl.zeros([STEP], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            peer = (r != rank) & (tl.sum((owner == r).to(tl.int32), axis=0) > 0)
            got = tl.load(part + tl.cast(r * max_tokens + t, tl.int64) * hidden + c + wide, mask=m & peer,
                          other=0.0).to(tl.float32)
            acc += tl.where(r == rank, own, got)
        tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + c + wide, round_to(acc, DTYPE), mask=m)


@triton.jit
def sum_tokens(out_ptr, w_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, lamport_rows, bases, rank, ybuf_off,
                part_off, lpart_off, from_partials, pid, grid, timeout, diag, WORLD: tl.constexpr, TOP_K: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HT: tl.constexpr, k_from=0):
    """Both modes, last: every token's partials in rank order. This rank's own partial is summed here
    from its expert buffer (latency mode) or read back from ``out`` (throughput mode: ``own_item``
    stored it there); a peer's is polled from the Lamport buffer and reset (latency mode) or read
    from the partials buffer after the barrier (throughput mode). The work items are (token, share
    of its column blocks) (``column_shares``); an item's routing is loaded once, so each column
    block waits on one round of loads. Each mode has a loop of its own, compiled apart from the
    other's waits, and its own columns per step (``BLOCK_HT`` in the throughput mode). The throughput
    mode starts at the program's item ``k_from`` (the interleaved combine summed the ones before)."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    ybuf = heap_ptr(bases, rank, ybuf_off, DTYPE)
    part = heap_ptr(bases, rank, part_off, DTYPE)
    lpart = heap_ptr(bases, rank, lpart_off, DTYPE)
    if from_partials:  # names of its own: the branches' widths differ, and Triton merges shared names
        wshares = column_shares(n_tokens, hidden, grid, BLOCK_HT)
        for item in range(pid + k_from * grid, n_tokens * wshares, grid):
            final_item(out_ptr, w_ptr, owner_ptr, row_ptr, ybuf, part, n_tokens, hidden, max_tokens, rank, item,
                        grid, WORLD, TOP_K, BLOCK_K, BLOCK_HT)
    else:
        cols = tl.arange(0, BLOCK_H)
        shares = column_shares(n_tokens, hidden, grid, BLOCK_H)
        for item in range(pid, n_tokens * shares, grid):
            t = item // shares
            owner = tl.load(owner_ptr + t * TOP_K + kk, mask=km, other=-1)
            row = tl.load(row_ptr + t * TOP_K + kk, mask=km, other=-1)  # -1 unless kept here
            wt = tl.load(w_ptr + t * TOP_K + kk, mask=km, other=0.0)
            lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
            for c in range(lo, hi, BLOCK_H):
                m = c + cols < hidden
                own = canonical_partial(weighted_rows(ybuf, row, wt, c, hidden, m, TOP_K, BLOCK_K, BLOCK_H),
                               DTYPE).to(tl.float32)
                acc = tl.zeros([BLOCK_H], dtype=tl.float32)
                for r in tl.static_range(WORLD):
                    got = tl.zeros([BLOCK_H], dtype=tl.float32)
                    if (r != rank) & (tl.sum((owner == r).to(tl.int32), axis=0) > 0):
                        at = lpart + tl.cast(r * lamport_rows + t, tl.int64) * hidden + c + cols
                        got = lamport_poll(at, m, r, t, rank, timeout, diag).to(tl.float32)
                        lamport_reset(at, m)
                    acc += tl.where(r == rank, own, got)
                tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + c + cols, round_to(acc, DTYPE), mask=m)


@triton.jit
def push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, dst_off, dst_rows, rank, s, n_s, item,
               DTYPE: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_H: tl.constexpr, LAMPORT: tl.constexpr, grid):
    """Item ``item`` of source ``s``'s tokens (``column_shares(n_s)``, as the home splits them in
    ``sum_tokens``): this rank's partial, pushed into row ``rank * dst_rows + t`` of the buffer at
    heap offset ``dst_off`` of ``s`` (as Lamport packets with ``LAMPORT``) when one of the token's
    entries is on this rank, kept or not."""
    STEP: tl.constexpr = throughput_step(BLOCK_H)
    cols = tl.arange(0, STEP)
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    shares = column_shares(n_s, hidden, grid, BLOCK_H)
    t = item // shares
    i0 = (s * max_tokens + t) * TOP_K
    e = tl.load(ids + i0 + kk, mask=km, other=-1)
    slot = tl.load(slot_ptr + i0 + kk, mask=km, other=-1)  # meaningful where the expert is mine
    wt = tl.load(wtab + i0 + kk, mask=km, other=0.0)
    here = (e >= 0) & (e // LOCAL == rank)
    slot = tl.where(here, slot, -1)
    if tl.sum(here.to(tl.int32), axis=0) > 0:
        dst = heap_ptr(bases, s, dst_off, DTYPE) + tl.cast(rank * dst_rows + t, tl.int64) * hidden
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        for c in range(lo, hi, STEP):
            m = c + cols < hidden
            part = weighted_rows(ybuf, slot, wt, c, hidden, m, TOP_K, BLOCK_K, STEP)
            if LAMPORT:
                lamport_store(dst + c + cols, canonical_partial(part, DTYPE), mask=m)
            else:
                tl.store(dst + c + cols, canonical_partial(part, DTYPE), mask=m)


@triton.jit
def own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, item, grid, TOP_K: tl.constexpr,
              BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """Throughput mode: item ``item`` of this rank's own tokens (the split of ``sum_tokens``): the
    partial of this rank's experts, stored into ``out``, where the same program reads it back after
    the barrier."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    STEP: tl.constexpr = throughput_step(BLOCK_H)
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    shares = column_shares(n_tokens, hidden, grid, BLOCK_H)
    t = item // shares
    row = tl.load(row_ptr + t * TOP_K + kk, mask=km, other=-1)  # -1 unless kept here
    wt = tl.load(w_ptr + t * TOP_K + kk, mask=km, other=0.0)
    lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
    sub = tl.arange(0, STEP)
    for c in range(lo, hi, STEP):
        m = c + sub < hidden
        summed = weighted_rows(ybuf, row, wt, c, hidden, m, TOP_K, BLOCK_K, STEP)
        tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + c + sub, canonical_partial(summed, DTYPE), mask=m)

