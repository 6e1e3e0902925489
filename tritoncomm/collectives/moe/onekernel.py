"""MoE dispatch in one kernel, for decode-sized instances (``MoEShape.one_kernel``).

The two-kernel dispatch (``dispatch.py``, then ``gather.py``) needs the kernel boundary between them:
a gather program reads routing and rows that many programs of every peer wrote. Here every
sending program also stores its **own copy** of the rank's whole routing (its ids, at most
``max_tokens * top_k`` of them) into every peer's copy table, row ``(pid,
rank)``. So after barrier slot ``pid``, program ``pid`` of the receiver holds, from program ``pid``
of every peer, all it needs: that source's count and routing (its copy) and the token rows of the
work items program ``pid`` sent (both sides split a source's rows alike, ``shares.py``). It then
lays out exactly those items, as the gather kernel would. One kernel and one barrier instead of two
kernels: the decode path's cost is mostly kernel boundaries and chains of dependent loads.

``moe_dispatch_one_kernel``, program ``pid``:

1. loads this rank's routing (``n_tokens * TOP_K <= BLOCK_N`` ids; ids outside ``[0, num_experts)``
   other than -1 become -1, counted in ``bad[0]`` by program 0) and stores it into row ``(pid,
   rank)`` of every peer's copy table (the shared copy, below: program 0 only), followed by -2 up to
   ``bound * TOP_K`` entries, ``bound`` being the call's bound on every rank's tokens: the receiver
   reads the count off the copy, with no word of its own to wait for first;
2. takes the work items ``pid, pid + grid, ...`` (row ``i // shares``, a run of its column blocks):
   a row's first item stores its ids and weights into every peer's ids and weights tables (for
   ``combine``), its weights (fp32) and what ``combine`` needs of it locally; every item stores its
   columns into the receive buffer of each peer that holds one of the row's experts (FP8: quantised,
   with scales) and into the row's slots on this rank's own experts, whose own entries come first
   (``route.py``), so the slots follow from this rank's routing in registers: the send kernel's
   ``send_items``. The own rows' layout thus runs before the barrier;
3. barrier slot ``pid``;
4. for every peer ``s`` in the order ``rank + 1, rank + 2, ...`` (this rank's experts' slot order):
   counts the source's entries per expert from its copy (the sources before it give the offsets,
   this rank's own first), and for each of its items of ``s``'s computes the row's slots
   (``route.copy_slots``), writes ``slot_of`` and stores the row's columns from the receive buffer
   into each of its kept slots on this rank. With the barrier program ``pid`` takes items ``pid,
   pid + grid, ...`` of every source (those program ``pid`` of the source sent); with packets, where
   nothing pairs programs, the sources' items are dealt as one sequence (``rank + 1``'s first), so
   that at decode a program lays out one source's row share, not one of every source's. Copies of
   at most ``ALL_COPIES_UP_TO`` entries over the peers are polled in one look and held in registers;
   larger ones one source at a time;
5. program 0: this rank's experts' counts, the bad ids and the entries dropped on its experts into
   ``bad``, both counters into the host-mapped words, and ``combine``'s header (``header.py``).

The slots, tables and outputs are those of the two-kernel dispatch, bit for bit, so ``combine`` and
every reader are the same. The halves follow the send channel's epoch parity, as there.

**Without a barrier** (``PACKETS``, ``MoEShape.packets``): the copies, the rows (and FP8 scales) and
the weights travel as Lamport packets (``kernels/lamport.py``: the data is its own flag), into
buffers of their own that are at rest between calls. Step 1 stores the copy as packets; step 2
sends each row, and its weights with the row's first item, only to the peers that own one of its
experts; step 3 is gone; in step 4 program ``pid`` polls (bounded) source ``s``'s copy, then per item
the weights (the row's first item) and the columns of every row sent to this rank, lays them out,
writes the tables ``combine`` reads (the source's ids and weights) into its own heap, and resets
every packet it read. One trip over the links and no fence: a program waits only for the data it
needs. The polls stay one block at a time: a block smaller than the program's threads (a row's
weights, FP8 scales) is polled warp by warp, and a loop that also waited on a larger block would
hold CTA barriers that the warps reach a different number of times (``kernels/lamport.py``).

**One shared copy** (``SHARED``, with packets; calls of at least ``MoEShape.shared_copy_from``
routing entries): a copy per program costs ``programs * entries * 4`` bytes per peer (1.1 MB at 128
tokens of top-8 with 264 programs, against 1.8 MB of tokens), sent before each program's rows.
Instead program 0 sends one copy per peer, into the rows program 0 would use, every program polls
it, and the last program to count itself done with it (``reset_shared_copies``) resets it. The
per-program copies stay for small calls: the count costs every program an atomic.

**Call check** (``sig``: op, dtype, the token bound every rank shares and the path, ``MoEAllToAll``):
with the barrier it travels in the barrier (``kernels.barrier``); with packets each program first
stores it as a header word into every peer's header table, row ``(half, pid)``, slot of its rank
(``kernels.lamport``, "Headers"), and program ``pid`` polls its row after the copies, compares and
puts it back at rest; the copies and the headers are polled in the same looks
(``lamport_poll_checked``), so a differing header also ends a wait for copy entries the peer never
sends (a rank whose bound is larger). A program that finds a difference records it and lays out
nothing from the peers (its own rows, laid out before, stay), and program 0 then sets every local
expert's count to 0 and leaves a header of no tokens (``gather.no_counts``): no row is the call's.

Why two halves are enough without the barrier: program ``pid`` of every rank polls a copy from
program ``pid`` of every peer in every call, and a rank sends its copies only after its previous
kernels on the stream have ended (``pdl_wait``). So when a peer's program sends into a half again,
two calls later, it has seen this rank's copy of the call in between, which this rank sent after
its dispatch of two calls back had ended, every reset included. The same holds for ``combine``'s
Lamport buffer: a rank passes a dispatch's polls only after every peer's previous combine ended.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    INTERPRET,
    barrier,
    epoch_commit_slots,
    heap_ptr,
    lamport_header_store,
    lamport_poll,
    lamport_poll_checked,
    lamport_reset,
    lamport_store,
    pow2_at_least,
    stamp,
)
from ...kernels.launcher import Launcher
from ...kernels.memory import address_ptr
from .check import header_look, headers_match
from .gather import finish_counts, no_counts
from .header import size_of, store_header
from .place import place_item, place_packets
from .route import copy_slots, expert_ids
from .sends import launch_epoch, send_items
from .shares import column_shares, dealt_first

__all__ = ["DISPATCH_STAGES", "launch_dispatch_one_kernel", "moe_dispatch_one_kernel", "reset_shared_copies"]

#: Stage stamps per program of the traced one-kernel dispatch (``TRACE``).
DISPATCH_STAGES = 6
_STAGES = tl.constexpr(DISPATCH_STAGES)
#: The most copy entries (peers' slots times the copy's width) that a program polls in one look and
#: holds in registers; larger copies are polled one source at a time. Compiled offline for sm_90, all
#: of 2048-entry copies held at once spilled at EP4 and EP8 (128 and 624 bytes with 8 warps at the
#: prefill shape's register cap, against 40 and 32 one source at a time).
ALL_COPIES_UP_TO = tl.constexpr(1024)


@triton.jit
def reset_shared_copies(table, readers, grid, rank, WORLD: tl.constexpr, BLOCK_N: tl.constexpr):
    """Called by every program once it has read the shared copies in ``table`` (``WORLD`` rows of
    ``BLOCK_N``): it counts itself in ``readers`` (a relaxed atomic: a copy's values were used
    before it, so those loads are complete), and the last one resets every peer's row and
    ``readers``. A peer writes this half again two launches later, after this launch has ended."""
    tl.debug_barrier()  # every thread of the program has used its copies
    if tl.atomic_add(readers, 1, sem="relaxed", scope="gpu") == grid - 1:
        nn = tl.arange(0, BLOCK_N)
        for s in tl.static_range(WORLD):
            if s != rank:
                lamport_reset(table + s * BLOCK_N + nn, SYNC=False)
        tl.store(readers, 0)


@triton.jit(do_not_specialize=["rank", "n_tokens", "bound", "ids_s0", "ids_s1", "w_s0", "w_s1",
                               "epoch_slots"])
def moe_dispatch_one_kernel(out_ptr, sc_out_ptr, x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1,
                            wts_ptr, slot_ptr, owner_ptr, row_ptr, counts_ptr, bad_ptr, bad_host_addr, n_tokens,
                            bound, hidden, max_tokens, num_experts, capacity, bases, rank, timeout, diag_addr,
                            flags_off, epochs_off, epoch_slots, recv_off, recv_half, peer_rows, ids_off, ids_half,
                            wtab_off, wtab_half, pw_off, pw_half, sc_off, sc_half, copy_off, copy_half,
                            readers_ptr, header_ptr, trace_ptr, hdr_off, hdr_half, sig,
                            WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_X: tl.constexpr, FP8: tl.constexpr,
                            PACKETS: tl.constexpr, SHARED: tl.constexpr, BLOCK_W: tl.constexpr, TRACE: tl.constexpr,
                            SENDERS: tl.constexpr = 0, LOOKAHEAD: tl.constexpr = False,
                            ROWS16: tl.constexpr = False):
    """See the module docstring. The copy table holds, per half, ``grid * WORLD`` rows of ``BLOCK_N``
    int32 (with ``SHARED``: the first ``WORLD``): the source's ids, then -2 up to ``bound * TOP_K``
    (``bound``: the call's bound on every rank's tokens, the same on every rank). The
    receive buffer (and its scales) holds ``peer_rows`` rows per peer; with ``PACKETS`` it, the copy
    table and the packet weights table (``pw_off``: ``TOP_K`` fp32 per row of the receive buffer) are
    Lamport buffers. ``epoch_slots``: the channel's programs (this launch may have fewer:
    ``epoch_commit_slots``). ``readers_ptr``: with ``SHARED``, per half the number of this launch's
    programs done with the copies (0 between launches). With ``TRACE`` each program stamps
    (``kernels.stamp``) ``DISPATCH_STAGES`` points into ``trace_ptr``: started, copies sent, rows
    sent, first peer's copy read, rows laid out, done. With ``SENDERS`` (packets only) programs ``[0,
    SENDERS)`` send the rows and the others lay out the peers' rows; every program still sends and
    polls its routing copies. ``LOOKAHEAD`` (``MoEShape.lookahead``): the sends' and the packet
    layout's loads one column block ahead (``send_items``, ``place_packets``).

    ``sig``: the call's signature (``MoEAllToAll``'s, with the bound), or None for no call check
    (module docstring, "Call check"); ``hdr_off`` / ``hdr_half``: the header words (packets only)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    if SENDERS == 0:  # every program sends, then lays out
        send_pid, send_grid, lay_pid, lay_grid = pid, grid, pid, grid
    else:  # senders' items split over SENDERS programs, the layout's over the others (1 << 30: none)
        send_pid = tl.where(pid < SENDERS, pid, 1 << 30)
        send_grid = tl.full([], SENDERS, tl.int32)
        lay_pid = tl.where(pid < SENDERS, 1 << 30, pid - SENDERS)
        lay_grid = grid - SENDERS
    DTYPE: tl.constexpr = tl.float8e4nv if FP8 else x_ptr.dtype.element_ty
    ROW: tl.constexpr = BLOCK_N  # a copy row: the ids, -2 past the source's entries up to the bound
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e, half = launch_epoch(bases, rank, epochs_off)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES)
    recv_base = recv_off + half * recv_half
    sc_base = sc_off + half * sc_half
    copy_base = copy_off + half * copy_half
    CHECK: tl.constexpr = sig is not None
    hdr_base = hdr_off + half * hdr_half
    if CHECK and PACKETS:  # my signature to this program of every peer, before anything else it sends
        for d in tl.static_range(WORLD):
            if d != rank:
                lamport_header_store(heap_ptr(bases, d, hdr_base + (pid * WORLD + rank) * 8, tl.int64), sig)
    # 1. this rank's routing, copied into row (pid, rank) of every peer's copy table
    nn = tl.arange(0, BLOCK_N)
    live = nn < n_tokens * TOP_K
    mine, bad = expert_ids(ids_ptr + (nn // TOP_K).to(tl.int64) * ids_s0 + (nn % TOP_K) * ids_s1, live, num_experts)
    my_row = tl.cast(((0 if SHARED else pid * WORLD) + rank) * ROW, tl.int64) * 4
    bounded = nn < bound * TOP_K  # the entries every rank's copy has
    copy = tl.where(live, mine, -2)  # -2 past this rank's entries: the count travels with the ids
    for d in tl.static_range(WORLD):
        if d != rank and (pid == 0 or not SHARED):  # the shared copy: program 0 sends it
            dst = heap_ptr(bases, d, copy_base + my_row, tl.int32, ALIGNED=False)
            if PACKETS:
                lamport_store(dst + nn, copy, mask=bounded)
            else:
                tl.store(dst + nn, copy, mask=bounded)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 1)
    # 2. the tokens, to the peers that hold their experts and into this rank's own slots
    if PACKETS:  # the weights go to the peers' packet tables
        wsend = pw_off + half * pw_half
    else:
        wsend = wtab_off + half * wtab_half
    send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr, sc_out_ptr,
               slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts, capacity, bases, rank,
               send_pid, send_grid, recv_base, peer_rows, ids_off + half * ids_half, wsend, sc_base, mine, nn, 0, 0,
               DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, False, True, PACKETS, 1, BLOCK_X, 1, 1, PACKETS,
               0, 0, 0, False, LOOKAHEAD)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 2)
    # 3. program pid of every rank has stored its copy and its items (with packets: nothing to wait for)
    ok = tl.full([], 1, tl.int1)  # every peer's signature equals mine (always without the check)
    if not PACKETS:
        ok = barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig)
    # 4. lay out the items this program was sent
    recv = heap_ptr(bases, rank, recv_base, DTYPE)
    sc = heap_ptr(bases, rank, sc_base, tl.float32)
    ids_tab = heap_ptr(bases, rank, ids_off + half * ids_half, tl.int32)
    wtab = heap_ptr(bases, rank, wtab_off + half * wtab_half, tl.float32)
    pw = heap_ptr(bases, rank, pw_off + half * pw_half, tl.float32)
    kk = tl.arange(0, BLOCK_K)
    km = kk < TOP_K
    earlier = tl.histogram(mine, BLOCK_X, mask=mine >= 0)  # per expert, the entries before source s: own first
    ws = tl.arange(0, BLOCK_W)
    copy_rows = heap_ptr(bases, rank, copy_base + tl.cast((0 if SHARED else pid * WORLD) * ROW, tl.int64) * 4,
                         tl.int32, ALIGNED=False)  # this program's part of the table: row s from source s
    sizes = tl.where(ws == rank, n_tokens, 0)  # every rank's tokens, for the header
    # small copies: every peer's in one look, held in registers (larger ones would spill: one at a time)
    ALL: tl.constexpr = BLOCK_W * BLOCK_N <= ALL_COPIES_UP_TO
    hdrs = heap_ptr(bases, rank, hdr_base + pid * WORLD * 8, tl.int64)  # every peer's header for this program
    if CHECK and PACKETS and not ALL:  # looked at before the copies: sent before them, usually there
        seen = header_look(hdrs, rank, WORLD, BLOCK_W)
    if ALL:
        copies = copy_rows + ws[:, None] * ROW + nn[None, :]
        peers = (ws[:, None] != rank) & (ws[:, None] < WORLD) & bounded[None, :]
        if PACKETS and CHECK:  # the copies and the headers in the same looks: a differing header ends the wait
            others = (ws[:, None] != rank) & (ws[:, None] < WORLD)
            got, heads = lamport_poll_checked(copies, peers, hdrs + ws[:, None], others, sig, ws[:, None], pid, rank,
                                              timeout, diag)
            seen = tl.sum(heads, axis=1)
        elif PACKETS:
            got = lamport_poll(copies, peers, ws[:, None], pid, rank, timeout, diag)
        else:
            got = tl.load(copies, mask=peers, other=-2)
        sizes += tl.sum(((got >= -1) & peers).to(tl.int32), axis=1) // TOP_K
        if TRACE:
            stamp(trace_ptr, pid * _STAGES + 3)
    # With packets nothing pairs programs: the peers' items are dealt as one sequence (source rank +
    # 1's first), so that at decode each program waits on one peer's row, not on one of every peer's.
    # A program may then wait on any peer program's rows: on GPUs the whole grid is resident (the
    # launch's register cap, ``register_cap``); in the CPU world, whose interpreter runs a rank's
    # programs in order, only where the layout has programs of its own (the senders never wait).
    DEAL: tl.constexpr = PACKETS and (SENDERS > 0 or not INTERPRET)
    if CHECK and PACKETS:  # every peer's header (sent before its copy), then back at rest
        ok = headers_match(hdrs, seen, sig, pid, rank, timeout, diag, WORLD, BLOCK_W)
    before = 0  # items of the sources before s
    for i in range(1, tl.where(ok, WORLD, 1)):  # nothing laid out after a mismatch
        s = (rank + i) % WORLD
        src = copy_rows + s * ROW
        if ALL:
            got_s = tl.sum(tl.where(ws[:, None] == s, got, 0), axis=0)
        else:
            if PACKETS:
                got_s = lamport_poll(src + nn, bounded, s, pid, rank, timeout, diag)
            else:
                got_s = tl.load(src + nn, mask=bounded, other=-2)
            sizes = tl.where(ws == s, tl.sum(((got_s >= -1) & bounded).to(tl.int32), axis=0) // TOP_K, sizes)
            if TRACE:
                if i == 1:
                    stamp(trace_ptr, pid * _STAGES + 3)
        n_s = size_of(sizes, s, BLOCK_W)
        ids_s = tl.where(nn < n_s * TOP_K, got_s, -1)
        peer_row = (s - (s > rank).to(tl.int32)) * peer_rows
        shares = column_shares(n_s, hidden, lay_grid, BLOCK_H)
        first = lay_pid
        if DEAL:
            first = dealt_first(lay_pid, lay_grid, before)
        for item in range(first, n_s * shares, lay_grid):
            t = item // shares
            if ALL:  # the row's entries from the copy in registers
                ex = tl.sum(tl.where(nn[None, :] == (t * TOP_K + kk)[:, None], ids_s[None, :], 0), axis=1)
                ex = tl.where(km, ex, -1)
            else:
                ex = tl.load(src + t * TOP_K + kk, mask=km, other=-1, volatile=PACKETS)
            at = copy_slots(ids_s, nn, ex, kk, t, earlier, capacity, LOCAL, TOP_K)
            if PACKETS:
                place_packets(out_ptr, sc_out_ptr, slot_ptr, ids_tab, wtab, recv, sc, pw, ex, at,
                              (s * max_tokens + t) * TOP_K, item, shares, rank, s, t, peer_row + t, hidden, timeout,
                              diag, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, LOOKAHEAD, ROWS16)
            else:
                place_item(out_ptr, sc_out_ptr, slot_ptr, recv, sc, ex, at, (s * max_tokens + t) * TOP_K, item,
                           shares, rank, peer_row + t, hidden, -1, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8)
        if PACKETS and not SHARED and not ALL:  # back at rest once every thread of the program has read it
            lamport_reset(src + nn, bounded)
        before += n_s * shares
        earlier += tl.histogram(ids_s, BLOCK_X, mask=ids_s >= 0)
    if PACKETS and not SHARED and ALL:
        lamport_reset(copies, peers)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 4)
    if SHARED:  # the last program done with the shared copies puts them back at rest
        reset_shared_copies(heap_ptr(bases, rank, copy_base, tl.int32, ALIGNED=False), readers_ptr + half, grid,
                            rank, WORLD, BLOCK_N)
    # 5. counts and problem counters
    if (pid == 0) & ok:
        finish_counts(counts_ptr, bad_ptr, bad_host_addr, earlier, capacity, rank, tl.sum(bad.to(tl.int32)), LOCAL,
                      BLOCK_X)
        store_header(header_ptr, sizes, half, BLOCK_W)
    if (pid == 0) & (ok == 0):
        no_counts(counts_ptr, header_ptr, half, LOCAL, BLOCK_X, BLOCK_W)
    epoch_commit_slots(epoch_ptr, e, epoch_slots)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 5)


def launch_dispatch_one_kernel(run: Launcher, comm, channel, out: torch.Tensor, scales: torch.Tensor | None,
                               x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, wts: torch.Tensor,
                               slot_of: torch.Tensor, owner: torch.Tensor, row: torch.Tensor, counts: torch.Tensor,
                               bad: torch.Tensor, bad_host_addr: int, *, max_tokens: int, num_experts: int,
                               capacity: int, local: int, recv_off: int, recv_half: int, peer_rows: int, ids_off: int,
                               ids_half: int, wtab_off: int, wtab_half: int, pw_off: int, pw_half: int, sc_off: int,
                               sc_half: int, copy_off: int, copy_half: int,
                               readers: torch.Tensor | None, bound: int, block_n: int, block_x: int, block_h: int,
                               packets: bool, num_warps: int, launch_opts: dict[str, bool | int],
                               header: torch.Tensor, trace: torch.Tensor | None = None, senders: int = 0,
                               lookahead: bool = False, sig: int | None = None, hdr_off: int = 0,
                               hdr_half: int = 0) -> None:
    """Launch ``moe_dispatch_one_kernel`` through ``run`` (its launcher: a 1-D grid); with
    ``packets`` the receive buffer, its scales, ``pw_off`` and the copy table are Lamport buffers at
    rest; with ``readers`` (int32 ``[2]``, zero, and packets) the copy table holds one shared copy
    per source (``MoEShape.shared_copy_from``). ``bound``: the call's bound on every rank's tokens,
    the same on every rank (``tokens_bound``, else ``max_tokens``). ``trace``: int64 ``[programs,
    DISPATCH_STAGES, 2]`` for the stage stamps, or None. ``header``: what ``combine`` reads
    (``header.py``). ``senders``: with packets, the programs that send (the others lay out); 0: all.
    ``lookahead``: loads one column block ahead. The receive rows start 16-byte aligned (``ROWS16``)
    when a row's bytes are a multiple of 16: the buffer is 256-byte aligned. ``sig``: the call's
    signature, or None (no call check); ``hdr_off`` / ``hdr_half``: the header words, with packets."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    k = ids.shape[1]
    fp8 = scales is not None
    run(out, scales if fp8 else out, x, x.stride(0), ids, ids.stride(0), ids.stride(1), weights, weights.stride(0),
        weights.stride(1), wts, slot_of, owner, row, counts, bad, bad_host_addr, x.shape[0], bound, x.shape[1],
        max_tokens, num_experts, capacity, bases, rank, timeout, diag, channel.flags_off, channel.epochs_off,
        channel.programs, recv_off, recv_half, peer_rows, ids_off, ids_half, wtab_off, wtab_half, pw_off, pw_half,
        sc_off, sc_half, copy_off, copy_half, counts if readers is None else readers, header,
        bad if trace is None else trace, hdr_off, hdr_half, sig,
        WORLD=world, LOCAL=local, TOP_K=k, BLOCK_K=pow2_at_least(k), BLOCK_H=block_h, BLOCK_N=block_n,
        BLOCK_X=block_x, FP8=fp8, PACKETS=packets, SHARED=readers is not None, BLOCK_W=pow2_at_least(world),
        TRACE=trace is not None, SENDERS=senders, LOOKAHEAD=bool(lookahead),
        ROWS16=x.shape[1] * (1 if fp8 else x.element_size()) % 16 == 0, num_warps=num_warps, **launch_opts)
