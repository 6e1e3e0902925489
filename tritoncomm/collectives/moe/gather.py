"""MoE dispatch, step 2 of 2 (local: it reads this rank's heap and input, after the send kernel).

``moe_gather_kernel`` lays out this rank's tokens per expert: every live row ``(source s, token t)``
of every source (``t`` below the source's count) that has a kept entry on one of this rank's
experts is read **once** and stored into each of its slots ``out[expert, slot]`` (at most ``TOP_K``
of them; ``route.row_slots`` computes them), so the reads are one row per token and the writes one
per kept entry. A peer's row comes from the receive buffer (the send kernel stored it there); the
rank's own rows come straight from its input ``x``, which the send kernel never copies (with ``FP8``
they are quantised here with ``wire.to_fp8``, the send kernel's rule, and their scales stored beside
them).

Program ``pid`` takes, per source, the work items ``pid, pid + grid, ...``: row ``i // shares`` and
the ``i % shares``-th run of its column blocks (``shares.py``; at decode a row's blocks spread over
programs). Every item computes its row's slots; each program sums the sources' superblock rows in
rank order as it goes. A row's first item writes what ``combine`` needs: for the entries of this
rank's experts their expert-buffer row, or -1 if dropped (``slot_of``, read by the owner-side
combine); for this rank's own rows each entry's owner rank and row there (``owner``, -1 if unrouted
or dropped, and ``row``). Program 0 writes this rank's experts' counts (``min(entries, capacity)``),
adds this rank's dropped entries (per expert, its entries whose slots fall past ``capacity``) to
``bad[1]``, then copies the two problem counters into host-mapped words, which the host reads
without synchronising.

It reads the tables' half given by the parity of the epoch the send kernel's program 0 stored.
Peer ``s``'s rows are rows ``(s - (s > rank)) * max_tokens + t`` of the receive buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import heap_ptr, pdl_launch_dependents, pdl_wait
from ...kernels.launcher import Launcher
from .route import row_slots, rows_per_load, rows_sum
from .shares import column_shares, pick, share_columns
from .wire import to_fp8

__all__ = ["launch_gather", "moe_gather_kernel", "place_item", "place_row"]


@triton.jit
def place_row(out_ptr, sc_out_ptr, x_ptr, x_stride, recv, sc, at, own, t, recv_row, lo, hi, hidden,
              TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Columns ``[lo, hi)`` of one token row, read once and stored into each of its kept slots ``at``
    (expert-buffer rows, -1 for none): the rank's own row ``t`` from ``x`` (quantised here under
    ``FP8``), a peer's from row ``recv_row`` of the receive buffer (and its scales). Also called by
    the one-kernel dispatch (``onekernel.py``)."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1  # scale groups per column block
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]  # [G, GW]
    groups = tl.arange(0, G)
    n_groups = hidden // 128
    t64 = tl.cast(t, tl.int64)
    r64 = tl.cast(recv_row, tl.int64)
    for c in range(lo, hi, BLOCK_H):
        m = c + cols < hidden
        gm = c + groups * 128 < hidden
        if own:
            v = tl.load(x_ptr + t64 * x_stride + c + cols, mask=m, other=0.0)
            if FP8:
                v, scale = to_fp8(v)
        else:
            v = tl.load(recv + r64 * hidden + c + cols, mask=m)
            if FP8:
                scale = tl.load(sc + r64 * n_groups + c // 128 + groups, mask=gm)
        for j in tl.static_range(TOP_K):
            a = pick(at, kk, j)
            # times hidden after the pick: 16-byte stores (a pick's result has no known divisibility)
            tl.store(out_ptr + a.to(tl.int64) * hidden + c + cols, v, mask=m & (a >= 0))
            if FP8:
                tl.store(sc_out_ptr + a.to(tl.int64) * n_groups + c // 128 + groups, scale, mask=gm & (a >= 0))


@triton.jit
def place_item(out_ptr, sc_out_ptr, x_ptr, x_stride, slot_ptr, owner_ptr, row_ptr, recv, sc, e, at, i0, t, item,
               shares, own, rank, recv_row, hidden, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """One work item of row ``t`` (entries ``e``, slots ``at``; ``i0`` its first entry in the tables):
    the row's first item writes what ``combine`` needs (module docstring); then the item's columns
    go into this rank's kept slots (``place_row``). Also called by the one-kernel dispatch."""
    kk = tl.arange(0, BLOCK_K)
    fm = (kk < TOP_K) & (item % shares == 0)  # the row's first item writes its routing
    on_me = (e >= 0) & (e // LOCAL == rank)  # entries of this rank's experts
    tl.store(slot_ptr + i0 + kk, at, mask=fm & on_me)
    if own:
        tl.store(owner_ptr + t * TOP_K + kk, tl.where(at >= 0, e // LOCAL, -1), mask=fm)
        tl.store(row_ptr + t * TOP_K + kk, at, mask=fm & (at >= 0))
    at = tl.where(on_me, at, -1)
    if tl.sum((at >= 0).to(tl.int32), axis=0) > 0:
        lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
        place_row(out_ptr, sc_out_ptr, x_ptr, x_stride, recv, sc, at, own, t, recv_row, lo, hi, hidden, TOP_K, BLOCK_K,
                  BLOCK_H, FP8)


@triton.jit(do_not_specialize=["rank"])
def moe_gather_kernel(out_ptr, sc_out_ptr, x_ptr, x_stride, slot_ptr, owner_ptr, row_ptr, counts_ptr, bad_ptr,
                      bad_host_addr, hidden, max_tokens, capacity, hist_blocks, bases, rank, epochs_off, recv_off,
                      recv_half, ids_off, ids_half, ntab_off, ntab_half, sc_off, sc_half, hist_off, hist_half,
                      WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_H: tl.constexpr, FP8: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr,
                      BLOCK_B: tl.constexpr, SUPER: tl.constexpr):
    """See the module docstring."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty  # e4m3 with FP8, else the tokens' dtype
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    recv = heap_ptr(bases, rank, recv_off + parity * recv_half, DTYPE)
    ids = heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32)
    ntab = heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32)
    sc = heap_ptr(bases, rank, sc_off + parity * sc_half, tl.float32)
    hist = heap_ptr(bases, rank, hist_off + parity * hist_half, tl.int32)
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    super_blocks = tl.cdiv(hist_blocks, SUPER)
    earlier = tl.zeros([BLOCK_X], dtype=tl.int32)  # per expert, the entries of the sources before s
    dropped = 0  # this rank's entries past their expert's capacity
    for s in range(WORLD):
        n_s = tl.load(ntab + s)
        own = s == rank
        peer_row = (s - (s > rank).to(tl.int32)) * max_tokens  # the source's first row in the receive buffer
        # the source's entries per expert (issued before the rows: needed after them)
        mine = rows_sum(hist, WORLD * hist_blocks + s * super_blocks, tl.cdiv(tl.cdiv(n_s * TOP_K, BLOCK_E), SUPER),
                        BLOCK_B, BLOCK_X)
        if own:  # own entries of e take slots earlier[e] ..; those past capacity are dropped
            dropped = tl.sum(tl.maximum(earlier + mine - capacity, 0) - tl.maximum(earlier - capacity, 0))
        shares = column_shares(n_s, hidden, grid, BLOCK_H)
        for item in range(pid, n_s * shares, grid):
            t = item // shares
            i0 = (s * max_tokens + t) * TOP_K
            e = tl.load(ids + i0 + kk, mask=km, other=-1)
            at = row_slots(ids + s * max_tokens * TOP_K, hist, e, kk, t, n_s * TOP_K, earlier, s * hist_blocks,
                           WORLD * hist_blocks + s * super_blocks, capacity, LOCAL, TOP_K, BLOCK_E, BLOCK_X, BLOCK_B,
                           SUPER)
            place_item(out_ptr, sc_out_ptr, x_ptr, x_stride, slot_ptr, owner_ptr, row_ptr, recv, sc, e, at, i0, t, item,
                       shares, own, rank, peer_row + t, hidden, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
        earlier += mine
    if pid == 0:  # earlier: now every source's entries per expert
        xs = tl.arange(0, BLOCK_X)
        first = rank * LOCAL
        tl.store(counts_ptr + xs - first, tl.minimum(earlier, capacity), mask=(xs >= first) & (xs < first + LOCAL))
        tl.store(bad_ptr + 1, tl.load(bad_ptr + 1) + dropped)
        two = tl.arange(0, 2)
        tl.store(bad_host_addr.to(tl.pointer_type(tl.int64)) + two, tl.load(bad_ptr + two))


def launch_gather(run: Launcher, comm, channel, out: torch.Tensor, scales: torch.Tensor | None, x: torch.Tensor,
                  slot_of: torch.Tensor, owner: torch.Tensor, row: torch.Tensor, counts: torch.Tensor,
                  bad: torch.Tensor, bad_host_addr: int, *, max_tokens: int, capacity: int, local: int, top_k: int,
                  recv_off: int, recv_half: int, ids_off: int, ids_half: int, ntab_off: int, ntab_half: int,
                  sc_off: int, sc_half: int, hist_off: int, hist_half: int, hist_blocks: int, block_e: int,
                  block_x: int, super_blocks: int, block_h: int, num_warps: int,
                  launch_opts: dict[str, bool | int]) -> None:
    """Launch ``moe_gather_kernel`` through ``run`` (its launcher: a 1-D grid)."""
    bases, rank, world, _, _ = comm.kernel_args()
    fp8 = scales is not None
    run(out, scales if fp8 else out, x, x.stride(0), slot_of, owner, row, counts, bad, bad_host_addr, out.shape[-1],
        max_tokens, capacity, hist_blocks, bases, rank, channel.epochs_off, recv_off, recv_half, ids_off, ids_half,
        ntab_off, ntab_half, sc_off, sc_half, hist_off, hist_half, WORLD=world, LOCAL=local, TOP_K=top_k,
        BLOCK_K=triton.next_power_of_2(top_k), BLOCK_H=block_h, FP8=fp8, BLOCK_E=block_e,
        BLOCK_X=block_x, BLOCK_B=rows_per_load(block_x), SUPER=super_blocks, num_warps=num_warps, **launch_opts)
