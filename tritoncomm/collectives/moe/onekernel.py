"""MoE dispatch in one kernel, for decode-sized instances (``MoEShape.one_kernel``).

The two-kernel dispatch (``dispatch.py``, then ``gather.py``) needs the kernel boundary between them:
a gather program reads routing and rows that many programs of every peer wrote. Here every
sending program also stores its **own copy** of the rank's whole routing (its ids, at most
``max_tokens * top_k`` of them, and the token count) into every rank's copy table, row ``(pid,
rank)``. So after barrier slot ``pid``, program ``pid`` of the receiver holds, from program ``pid``
of every source, all it needs: that source's count and routing (its copy) and the token rows of the
work items program ``pid`` sent (both sides split a source's rows alike, ``shares.py``). It then
lays out exactly those items, as the gather kernel would. One kernel and one barrier instead of two
kernels: the decode path's cost is mostly kernel boundaries and chains of dependent loads.

``moe_dispatch_one_kernel``, program ``pid``:

1. loads this rank's routing (``n_tokens * TOP_K <= BLOCK_N`` ids; ids outside ``[0, num_experts)``
   other than -1 become -1, counted in ``bad[0]`` by program 0) and stores it, with ``n_tokens``,
   into row ``(pid, rank)`` of every rank's copy table;
2. takes the work items ``pid, pid + grid, ...`` (row ``i // shares``, a run of its column blocks):
   a row's first item stores its ids and weights into every rank's ids and weights tables (for
   ``combine``) and its weights (fp32) locally; every item stores its columns into the receive
   buffer of each peer that holds one of the row's experts (FP8: quantised, with scales), as the
   send kernel does;
3. barrier slot ``pid``;
4. for every source ``s`` in rank order: counts the source's entries per expert from its copy (the
   earlier sources' counts give the offsets), and for each of ``s``'s items ``pid, pid + grid,
   ...`` computes the row's slots (its expert's entries before it: earlier sources, then a count in
   the source's copy), writes what ``combine`` needs (``slot_of``; for own rows ``owner`` and
   ``row``), and stores the row's columns into each of its kept slots on this rank (peer rows from
   the receive buffer, own rows from ``x``, quantised here under FP8);
5. program 0: this rank's experts' counts, the dropped entries into ``bad[1]``, both counters into
   the host-mapped words.

The slots, tables and outputs are those of the two-kernel dispatch, bit for bit, so ``combine`` and
every reader are the same. The halves follow the send channel's epoch parity, as there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import barrier, epoch_commit, heap_ptr, pdl_launch_dependents, pdl_wait, program_epoch
from ...kernels.launcher import Launcher
from .dispatch import _expert_ids
from .shares import column_shares, pick, share_columns
from .wire import to_fp8

__all__ = ["launch_dispatch_one_kernel", "moe_dispatch_one_kernel"]


@triton.jit
def _send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, n_tokens, hidden, max_tokens,
                num_experts, bases, rank, pid, grid, recv_base, ids_base, wtab_base, sc_base, DTYPE: tl.constexpr,
                WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Step 2 of the module docstring."""
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]
    groups = tl.arange(0, G)
    shares = column_shares(n_tokens, hidden, grid, BLOCK_H)
    for item in range(pid, n_tokens * shares, grid):
        t = item // shares
        t64 = tl.cast(t, tl.int64)
        ids, _ = _expert_ids(ids_ptr + t64 * ids_s0 + kk * ids_s1, km, num_experts)
        owner = tl.where(km & (ids >= 0), ids // LOCAL, -1)
        row = tl.cast(rank * max_tokens + t, tl.int64)
        fm = km & (item % shares == 0)  # the row's first item sends its routing
        wt = tl.load(w_ptr + t64 * w_s0 + kk * w_s1, mask=km, other=0.0).to(tl.float32)
        tl.store(wts_ptr + t * TOP_K + kk, wt, mask=fm)
        for d in tl.static_range(WORLD):
            tl.store(heap_ptr(bases, d, ids_base + row * TOP_K * 4, tl.int32, ALIGNED=False) + kk, ids, mask=fm)
            tl.store(heap_ptr(bases, d, wtab_base + row * TOP_K * 4, tl.float32, ALIGNED=False) + kk, wt, mask=fm)
        if tl.sum(((owner >= 0) & (owner != rank)).to(tl.int32)) > 0:
            lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
            for c in range(lo, hi, BLOCK_H):
                m = c + cols < hidden
                v = tl.load(x_ptr + t64 * x_stride + c + cols, mask=m, other=0.0)
                if FP8:
                    v, scale = to_fp8(v)
                for d in tl.static_range(WORLD):
                    if (d != rank) & (tl.sum((owner == d).to(tl.int32)) > 0):
                        prow = tl.cast(rank - (rank > d).to(tl.int32), tl.int64) * max_tokens + t64
                        tl.store(heap_ptr(bases, d, recv_base, DTYPE) + prow * hidden + c + cols, v, mask=m)
                        if FP8:
                            sdst = heap_ptr(bases, d, sc_base + prow * (hidden // 128) * 4, tl.float32, ALIGNED=False)
                            tl.store(sdst + c // 128 + groups, scale, mask=c + groups * 128 < hidden)


@triton.jit(do_not_specialize=["rank", "n_tokens", "ids_s0", "ids_s1", "w_s0", "w_s1"])
def moe_dispatch_one_kernel(out_ptr, sc_out_ptr, x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1,
                            wts_ptr, slot_ptr, owner_ptr, row_ptr, counts_ptr, bad_ptr, bad_host_addr, n_tokens,
                            hidden, max_tokens, num_experts, capacity, bases, rank, timeout, diag_addr, flags_off,
                            epochs_off, recv_off, recv_half, ids_off, ids_half, wtab_off, wtab_half, ntab_off,
                            ntab_half, sc_off, sc_half, copy_off, copy_half, WORLD: tl.constexpr,
                            LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_X: tl.constexpr, FP8: tl.constexpr):
    """See the module docstring. The copy table holds, per half, ``grid * WORLD`` rows of ``BLOCK_N
    + 1`` int32: the source's ids, then its token count."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = tl.float8e4nv if FP8 else x_ptr.dtype.element_ty
    G: tl.constexpr = BLOCK_H // 128 if FP8 else 1
    GW: tl.constexpr = 128 if FP8 else BLOCK_H
    ROW: tl.constexpr = BLOCK_N + 1  # a copy row: the ids, then the count
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    half = (e & 1).to(tl.int64)
    recv_base = recv_off + half * recv_half
    sc_base = sc_off + half * sc_half
    copy_base = copy_off + half * copy_half
    # 1. this rank's routing, copied into row (pid, rank) of every rank's copy table
    nn = tl.arange(0, BLOCK_N)
    live = nn < n_tokens * TOP_K
    mine, bad = _expert_ids(ids_ptr + (nn // TOP_K).to(tl.int64) * ids_s0 + (nn % TOP_K) * ids_s1, live, num_experts)
    my_row = tl.cast((pid * WORLD + rank) * ROW, tl.int64) * 4
    for d in tl.static_range(WORLD):
        dst = heap_ptr(bases, d, copy_base + my_row, tl.int32, ALIGNED=False)
        tl.store(dst + nn, mine, mask=live)
        tl.store(dst + BLOCK_N, n_tokens)
    if pid == 0:
        for d in tl.static_range(WORLD):  # the count table, for combine
            tl.store(heap_ptr(bases, d, ntab_off + half * ntab_half, tl.int32, ALIGNED=False) + rank, n_tokens)
    # 2. the tokens, to the peers that hold their experts
    _send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, n_tokens, hidden, max_tokens,
                num_experts, bases, rank, pid, grid, recv_base, ids_off + half * ids_half,
                wtab_off + half * wtab_half, sc_base, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
    # 3. program pid of every rank has stored its copy and its items
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    # 4. lay out the items this program was sent, and its own
    recv = heap_ptr(bases, rank, recv_base, DTYPE)
    sc = heap_ptr(bases, rank, sc_base, tl.float32)
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    cols = (tl.arange(0, G) * GW)[:, None] + tl.arange(0, GW)[None, :]
    groups = tl.arange(0, G)
    n_groups = hidden // 128
    earlier = tl.zeros([BLOCK_X], dtype=tl.int32)  # per expert, the entries of the sources before s
    dropped = 0
    for s in range(WORLD):
        src = heap_ptr(bases, rank, copy_base + tl.cast((pid * WORLD + s) * ROW, tl.int64) * 4, tl.int32, ALIGNED=False)
        n_s = tl.load(src + BLOCK_N)
        ids_s = tl.load(src + nn, mask=nn < n_s * TOP_K, other=-1)
        per_expert = tl.histogram(ids_s, BLOCK_X, mask=ids_s >= 0)
        own = s == rank
        if own:
            dropped = tl.sum(tl.maximum(earlier + per_expert - capacity, 0) - tl.maximum(earlier - capacity, 0))
        peer_row = (s - (s > rank).to(tl.int32)) * max_tokens
        shares = column_shares(n_s, hidden, grid, BLOCK_H)
        for item in range(pid, n_s * shares, grid):
            t = item // shares
            p0 = t * TOP_K
            ex = tl.load(src + p0 + kk, mask=km, other=-1)
            before = tl.sum(((ids_s[None, :] == ex[:, None]) & (nn[None, :] < (p0 + kk)[:, None])).to(tl.int32), axis=1)
            slot = tl.gather(earlier, tl.maximum(ex, 0), 0) + before
            at = tl.where((ex >= 0) & (slot < capacity), (ex % LOCAL) * capacity + slot, -1)
            i0 = (s * max_tokens + t) * TOP_K
            fm = km & (item % shares == 0)
            on_me = (ex >= 0) & (ex // LOCAL == rank)
            tl.store(slot_ptr + i0 + kk, at, mask=fm & on_me)
            if own:
                tl.store(owner_ptr + t * TOP_K + kk, tl.where(at >= 0, ex // LOCAL, -1), mask=fm)
                tl.store(row_ptr + t * TOP_K + kk, at, mask=fm & (at >= 0))
            at = tl.where(on_me, at, -1)
            if tl.sum((at >= 0).to(tl.int32), axis=0) > 0:
                t64 = tl.cast(t, tl.int64)
                r64 = tl.cast(peer_row + t, tl.int64)
                lo, hi = share_columns(item % shares, shares, hidden, BLOCK_H)
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
                        tl.store(out_ptr + a.to(tl.int64) * hidden + c + cols, v, mask=m & (a >= 0))
                        if FP8:
                            tl.store(sc_out_ptr + a.to(tl.int64) * n_groups + c // 128 + groups, scale,
                                     mask=gm & (a >= 0))
        earlier += per_expert
    # 5. counts and problem counters
    if pid == 0:
        xs = tl.arange(0, BLOCK_X)
        first = rank * LOCAL
        tl.store(counts_ptr + xs - first, tl.minimum(earlier, capacity), mask=(xs >= first) & (xs < first + LOCAL))
        two = tl.arange(0, 2)
        now = tl.load(bad_ptr + two) + tl.where(two == 0, tl.sum(bad.to(tl.int64)), dropped.to(tl.int64))
        tl.store(bad_ptr + two, now)
        tl.store(bad_host_addr.to(tl.pointer_type(tl.int64)) + two, now)
    epoch_commit(epoch_ptr, e)


def launch_dispatch_one_kernel(run: Launcher, comm, channel, out: torch.Tensor, scales: torch.Tensor | None,
                               x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, wts: torch.Tensor,
                               slot_of: torch.Tensor, owner: torch.Tensor, row: torch.Tensor, counts: torch.Tensor,
                               bad: torch.Tensor, bad_host_addr: int, *, max_tokens: int, num_experts: int,
                               capacity: int, local: int, recv_off: int, recv_half: int, ids_off: int, ids_half: int,
                               wtab_off: int, wtab_half: int, ntab_off: int, ntab_half: int, sc_off: int,
                               sc_half: int, copy_off: int, copy_half: int, block_n: int, block_x: int, block_h: int,
                               num_warps: int, launch_opts: dict[str, bool | int]) -> None:
    """Launch ``moe_dispatch_one_kernel`` through ``run`` (its launcher: a 1-D grid)."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    k = ids.shape[1]
    fp8 = scales is not None
    run(out, scales if fp8 else out, x, x.stride(0), ids, ids.stride(0), ids.stride(1), weights, weights.stride(0),
        weights.stride(1), wts, slot_of, owner, row, counts, bad, bad_host_addr, x.shape[0], x.shape[1], max_tokens,
        num_experts, capacity, bases, rank, timeout, diag, channel.flags_off, channel.epochs_off, recv_off, recv_half,
        ids_off, ids_half, wtab_off, wtab_half, ntab_off, ntab_half, sc_off, sc_half, copy_off, copy_half,
        WORLD=world, LOCAL=local, TOP_K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_H=block_h, BLOCK_N=block_n,
        BLOCK_X=block_x, FP8=fp8, num_warps=num_warps, **launch_opts)
