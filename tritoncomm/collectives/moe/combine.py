"""MoE combine: every token's weighted expert outputs summed back on the rank the token came from.

**Numerics, both modes.** ``out[t] = sum_r part_r`` in fp32 over the ranks ``r = 0 .. WORLD - 1`` in
order, rounded once to the dtype, where ``part_r`` is the sum in fp32 of ``w[t, j] * y_r[expert_j,
slot_j]`` over the token's kept entries ``j`` on rank ``r`` in ``j`` order (+0.0 when the token
routes to ``r`` but every such entry was dropped), rounded to the dtype, a -0.0 taken as +0.0 (the
Lamport packets' rule, ``kernels/lamport.py``; each product is rounded before its add: the launch
turns contraction off, so both worlds and torch's ``acc + w * y`` agree; absent terms add exactly
nothing). The bits depend only on the inputs, never on arrival order nor on the mode, so a token's
output does not change with the batch it is in.

``moe_combine_kernel`` chooses its mode on the device from the call's total token count (every
rank's count, which the dispatch left in a header with its tables' half, ``header.py``: every rank
makes the same choice): below
``throughput_from`` tokens, the latency mode; from it on, the throughput mode. In both, an owner
computes ``part_r`` of the tokens peers sent it and pushes one row per token (not one per entry)
home: program ``pid`` of owner ``r`` takes, for every other source ``s`` (in the order ``r + 1, r +
2, ...``), the items ``pid, pid + grid, ...`` of ``s``'s ``n_s`` tokens that have an entry on
``r``, kept or not (the home knows which ranks its tokens route to, not which entries they
dropped), an item being token ``i // shares`` and the ``i % shares``-th run of its column blocks
(``shares.py``; ``shares = column_shares(n_s)``: at decode a token's blocks spread over programs).
The home splits its own tokens the same way. In the throughput mode program ``pid`` reads what
program ``pid`` of every peer pushed (its barrier pairs them); in the latency mode nothing pairs
programs, so program ``pid`` sums the items of program ``grid - 1 - pid`` (a program with one more
item to push has one fewer to sum; on GPUs, where every program of the grid is resident: in the CPU
world, whose programs run one after another, its own), ``MoEShape.push_programs`` can give
pushing and summing to different programs altogether, and the pushes deal the sources' items to the
programs as one sequence (``r + 1``'s first, then ``r + 2``'s, ...), so that at decode a program
pushes one source's share, not one of every source's (in the CPU world only where pushing programs
are apart: they never wait there).

* **Latency mode** (Lamport packets, no barrier): the rows go into row ``(r, t)`` of the home's
  Lamport buffer (``lamport_store``: the data is its own flag). Then each home program sums its own
  experts' part of its items from its own expert buffer, polls each peer's row that the token's
  routing says was pushed (bounded, like every wait), resets it, and adds the partials in rank
  order. One trip over the links, nothing else.
* **Throughput mode** (bulk pushes, then one barrier): the rows go into row ``(r, t)`` of the home's
  partials buffer. Between the first peer's items each program sums its own tokens' items' own part
  into ``out``: that HBM work runs while the pushes cross the links. After the barrier on slot
  ``pid`` (which pairs program ``pid`` everywhere), each rank adds, in rank order, its own part
  (read back from ``out`` by the program that stored it) and the peers' from its partials buffer.
  Interleaved (``MoEShape.combine_interleave_from``; ``_push_interleaved``), each program pushes the
  first half of its items, arrives at a second barrier slot ``grid + pid`` and waits there, then
  adds up the first half of its own items in full while it pushes its second half: both sides
  split a source's tokens alike, so those items' partials came in the peers' first halves.
  Chunked (``MoEShape.combine_chunks``; ``_push_chunked``), no barrier: each program pushes its
  items in chunks and publishes its count of pushed chunks at slot ``grid + pid``; after chunk
  ``c`` it waits until every peer has published chunk ``c - 1`` and sums its own items of that
  chunk in full, its own part computed from the expert buffer in registers.

An owner's expert buffer is next written after its next dispatch (by the experts, or by
``combine``'s copy), and a peer writes a rank's partials or Lamport buffer again only in the next
combine, after that dispatch: no rank passes that dispatch's barrier slots (or, with packets, its
polls of every peer's routing copy, sent only after the peer's previous kernels ended) before every
peer's combine kernel has ended, its resets included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    INTERPRET,
    barrier,
    barrier_arrive,
    barrier_wait,
    epoch_commit_slots,
    heap_ptr,
    pdl_launch_dependents,
    pdl_wait,
    pow2_at_least,
    program_epoch,
    stamp,
)
from ...kernels.launcher import Launcher
from ...kernels.memory import address_ptr
from .header import load_header, size_of
from .partials import final_item, own_item, push_item, sum_tokens
from .shares import column_shares, dealt_first, first_half, program_items

__all__ = ["COMBINE_STAGES", "launch_combine", "moe_combine_kernel"]

#: Stage stamps per program of the traced combine (``TRACE``).
COMBINE_STAGES = 4
_STAGES = tl.constexpr(COMBINE_STAGES)


@triton.jit
def _push_partials(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, bases, rank,
                   ybuf_off, ids, wtab, sizes, part_off, pid, grid, DTYPE: tl.constexpr, WORLD: tl.constexpr,
                   LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_W: tl.constexpr):
    """Throughput mode, before the barrier: this rank's partial of every token received from a peer,
    pushed to the token's home (peers in the order ``rank + 1, rank + 2, ...``), and of its own
    tokens, kept in ``out``. The own items alternate with the first peer's, so that the local sums
    run while the pushes cross the links."""
    ybuf = heap_ptr(bases, rank, ybuf_off, DTYPE)
    own_items = n_tokens * column_shares(n_tokens, hidden, grid, BLOCK_H)
    for i in range(1, WORLD):
        s = (rank + i) % WORLD
        n_s = size_of(sizes, s, BLOCK_W)
        items = n_s * column_shares(n_s, hidden, grid, BLOCK_H)
        last = tl.where(i == 1, tl.maximum(items, own_items), items)
        for item in range(pid, last, grid):
            if item < items:
                push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, part_off, max_tokens, rank, s, n_s,
                           item, DTYPE, LOCAL, TOP_K, BLOCK_K, BLOCK_H, False, grid)
            if (i == 1) & (item < own_items):
                own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, item, grid, TOP_K,
                          BLOCK_K, BLOCK_H)
    if WORLD == 1:
        for item in range(pid, own_items, grid):
            own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, item, grid, TOP_K, BLOCK_K,
                      BLOCK_H)


@triton.jit
def _push_interleaved(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, bases, rank,
                      ybuf_off, ids, wtab, sizes, part_off, flags_off, e, timeout, diag, pid, grid, DTYPE: tl.constexpr,
                      WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """Throughput mode, interleaved (``MoEShape.combine_interleave_from``): ``_push_partials`` in two
    halves. The program pushes the first half (``shares.first_half``) of its items of each peer's
    tokens, the first peer's alternating with the first half of its own items' own part, and
    arrives at barrier slot ``grid + pid``; then it sums its next own item's own part, waits there
    (every peer's program ``pid`` has then pushed the first half of this rank's tokens: the same
    split), and alternates one pushed item of its second half with one task of the HBM side: the
    final sums (``final_item``) of its first-half own items, then the own part of the rest. A final
    sum reads own parts this program stored into ``out`` before its arrival: the CTA barriers of the
    arrival and the wait order those stores, by any of its threads, before the reads. Returns how
    many of its own items it summed in full (the rest after the barrier on slot ``pid``)."""
    ybuf = heap_ptr(bases, rank, ybuf_off, DTYPE)
    part = heap_ptr(bases, rank, part_off, DTYPE)
    own_items = n_tokens * column_shares(n_tokens, hidden, grid, BLOCK_H)
    n_own = program_items(own_items, pid, grid)
    h_own = first_half(own_items, pid, grid)
    for i in range(1, WORLD):
        s = (rank + i) % WORLD
        n_s = size_of(sizes, s, BLOCK_W)
        half = first_half(n_s * column_shares(n_s, hidden, grid, BLOCK_H), pid, grid)
        for k in range(0, tl.where(i == 1, tl.maximum(half, h_own), half)):
            if k < half:
                push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, part_off, max_tokens, rank, s, n_s,
                           pid + k * grid, DTYPE, LOCAL, TOP_K, BLOCK_K, BLOCK_H, False, grid)
            if (i == 1) & (k < h_own):
                own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, pid + k * grid, grid, TOP_K, BLOCK_K,
                          BLOCK_H)
    barrier_arrive(bases, rank, WORLD, flags_off, grid + pid, e)
    if h_own < n_own:  # local work while the peers' first halves land
        own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, pid + h_own * grid, grid, TOP_K, BLOCK_K, BLOCK_H)
    barrier_wait(bases, rank, WORLD, flags_off, grid + pid, e, timeout, diag)
    tasks = h_own + tl.maximum(n_own - h_own - 1, 0)  # the first half's final sums, then the rest's own parts
    for i in range(1, WORLD):
        s = (rank + i) % WORLD
        n_s = size_of(sizes, s, BLOCK_W)
        items = n_s * column_shares(n_s, hidden, grid, BLOCK_H)
        half = first_half(items, pid, grid)
        rest = program_items(items, pid, grid) - half  # this peer's second half
        q_lo = tasks * (i - 1) // (WORLD - 1)  # this peer's share of the tasks
        q_hi = tasks * i // (WORLD - 1)
        for j in range(0, tl.maximum(rest, q_hi - q_lo)):
            if j < rest:
                push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, part_off, max_tokens, rank, s, n_s,
                           pid + (half + j) * grid, DTYPE, LOCAL, TOP_K, BLOCK_K, BLOCK_H, False, grid)
            q = q_lo + j
            if q < tl.minimum(q_hi, h_own):
                final_item(out_ptr, w_ptr, owner_ptr, row_ptr, ybuf, part, n_tokens, hidden, max_tokens, rank,
                            pid + q * grid, grid, WORLD, TOP_K, BLOCK_K, BLOCK_H)
            elif q < q_hi:
                own_item(out_ptr, w_ptr, row_ptr, ybuf, n_tokens, hidden, pid + (q + 1) * grid, grid, TOP_K,
                          BLOCK_K, BLOCK_H)
    return h_own


@triton.jit
def _push_chunked(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, bases, rank, ybuf_off,
                  ids, wtab, sizes, part_off, flags_off, e, timeout, diag, pid, grid, DTYPE: tl.constexpr,
                  WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, CHUNKS: tl.constexpr):
    """Throughput mode, chunked (``MoEShape.combine_chunks``), no barrier. Program ``pid``'s items of
    each source (``pid, pid + grid, ...``) are split into ``CHUNKS`` runs by their count, which both
    sides compute alike. For chunk ``c`` the program pushes its run ``c`` of every peer's tokens, then
    arrives at slot ``grid + pid`` with ``e * (CHUNKS + 1) + c + 1`` (the values grow from call to
    call, as a slot's epochs must); then it waits there for ``... + c`` (every peer's program ``pid``
    has pushed its run ``c - 1`` of this rank's tokens) and sums run ``c - 1`` of its own items in
    full (``final_item`` with ``OWN_HERE``). Ordering: ``barrier_arrive`` publishes (CTA barrier,
    system-scope release) every partial this program stored before it, and ``barrier_wait`` (bounded,
    like every wait) acquires them, so the partials of run ``c - 1`` are visible to every thread
    that sums them. A program waits only for chunks its counterparts publish before they wait
    themselves, so no wait closes a cycle. Returns its count of own items (all summed)."""
    ybuf = heap_ptr(bases, rank, ybuf_off, DTYPE)
    part = heap_ptr(bases, rank, part_off, DTYPE)
    n_own = program_items(n_tokens * column_shares(n_tokens, hidden, grid, BLOCK_H), pid, grid)
    base = e * (CHUNKS + 1)
    for c in range(0, CHUNKS + 1):
        if c < CHUNKS:
            for i in range(1, WORLD):
                s = (rank + i) % WORLD
                n_s = size_of(sizes, s, BLOCK_W)
                n_p = program_items(n_s * column_shares(n_s, hidden, grid, BLOCK_H), pid, grid)
                for k in range(c * n_p // CHUNKS, (c + 1) * n_p // CHUNKS):
                    push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, part_off, max_tokens, rank, s,
                               n_s, pid + k * grid, DTYPE, LOCAL, TOP_K, BLOCK_K, BLOCK_H, False, grid)
            barrier_arrive(bases, rank, WORLD, flags_off, grid + pid, (base + c + 1).to(tl.uint32))
        if c > 0:
            barrier_wait(bases, rank, WORLD, flags_off, grid + pid, (base + c).to(tl.uint32), timeout, diag)
            for k in range((c - 1) * n_own // CHUNKS, c * n_own // CHUNKS):
                final_item(out_ptr, w_ptr, owner_ptr, row_ptr, ybuf, part, n_tokens, hidden, max_tokens, rank,
                            pid + k * grid, grid, WORLD, TOP_K, BLOCK_K, BLOCK_H, True)
    return n_own


@triton.jit
def _push_packets(slot_ptr, hidden, max_tokens, lamport_rows, bases, rank, ybuf_off, ids, wtab, sizes, lpart_off,
                  pid, grid, DTYPE: tl.constexpr, WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, DEAL: tl.constexpr):
    """Latency mode, first: this rank's partial of every token received from a peer, pushed to the
    token's home as Lamport packets (peers in the order ``rank + 1, rank + 2, ...``). With ``DEAL``
    the peers' items are dealt to the programs as one sequence, so that at decode a program pushes
    one peer's item, not one of every peer's; else each peer's from program ``pid`` on."""
    ybuf = heap_ptr(bases, rank, ybuf_off, DTYPE)
    before = 0  # items of the sources before s
    for i in range(1, WORLD):
        s = (rank + i) % WORLD
        n_s = size_of(sizes, s, BLOCK_W)
        items = n_s * column_shares(n_s, hidden, grid, BLOCK_H)
        first = pid
        if DEAL:
            first = dealt_first(pid, grid, before)
        for item in range(first, items, grid):
            push_item(slot_ptr, hidden, max_tokens, bases, ybuf, ids, wtab, lpart_off, lamport_rows, rank, s, n_s,
                       item, DTYPE, LOCAL, TOP_K, BLOCK_K, BLOCK_H, True, grid)
        before += items


# one build whatever the counts
@triton.jit(do_not_specialize=["rank", "n_tokens", "throughput_from", "lamport_rows", "epoch_slots"])
def moe_combine_kernel(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, throughput_from,
                       lamport_rows, bases, rank, timeout, diag_addr, flags_off, epochs_off, epoch_slots, header_ptr,
                       ybuf_off, ids_off, ids_half, wtab_off, wtab_half, part_off, lpart_off, trace_ptr,
                       WORLD: tl.constexpr,
                       LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr,
                       BLOCK_H: tl.constexpr, TRACE: tl.constexpr, PUSHERS: tl.constexpr = 0,
                       BLOCK_HT: tl.constexpr = 0, INTERLEAVE: tl.constexpr = False, CHUNKS: tl.constexpr = 0):
    """``out[t]`` for ``t < n_tokens`` (see the module docstring). With ``TRACE`` each program
    stamps (``kernels.stamp``) ``COMBINE_STAGES`` points into ``trace_ptr``: started, mode known,
    partials pushed (throughput: and the barrier passed), done. With ``PUSHERS``, in the latency mode
    programs ``[0, PUSHERS)`` push and the others sum (nothing pairs programs there); the throughput
    mode's barrier pairs program ``pid`` across ranks, so there every program does both. In the
    latency mode without ``PUSHERS`` program ``pid`` sums the items of program ``grid - 1 - pid``
    (nothing pairs programs there either), so that the programs with one more item to push have one
    fewer to sum: with 384 rows on 264 programs the busiest has 3 rows, not 4. Not in the CPU world,
    whose interpreter runs a rank's programs one after another: there program ``pid`` of each rank
    would wait for the pushes of a peer's program that runs only after it, so it sums its own. The
    throughput mode steps ``BLOCK_HT`` columns at a time (0: ``BLOCK_H``), the same on every rank.
    With ``INTERLEAVE`` (barrier slots ``grid + pid`` too) the throughput mode sums half of each
    program's own tokens while the second half of its pushes cross the links
    (``_push_interleaved``). With ``CHUNKS`` (slots ``grid + pid`` too; not with ``INTERLEAVE``) the
    throughput mode has no barrier and sums its own tokens chunk by chunk (``_push_chunked``)."""
    BLOCK_T: tl.constexpr = BLOCK_HT if BLOCK_HT > 0 else BLOCK_H
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    if PUSHERS == 0:  # the latency mode's sums in the reverse order of its pushes (below)
        push_pid, push_grid, sum_pid, sum_grid = pid, grid, grid - 1 - pid, grid
        if INTERPRET:  # a rank's programs run one after another: none may wait on a later one's pushes
            sum_pid = pid
    else:  # latency mode: pushes over PUSHERS programs, sums over the others (1 << 30: none)
        push_pid = tl.where(pid < PUSHERS, pid, 1 << 30)
        push_grid = tl.full([], PUSHERS, tl.int32)
        sum_pid = tl.where(pid < PUSHERS, 1 << 30, pid - PUSHERS)
        sum_grid = grid - PUSHERS
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    diag = address_ptr(diag_addr, tl.int64)
    pdl_wait()  # launched with PDL: the previous kernel has ended
    pdl_launch_dependents()
    if TRACE:
        stamp(trace_ptr, pid * _STAGES)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    sizes, parity = load_header(header_ptr, BLOCK_W)  # every rank's tokens, the dispatch's half
    total = tl.sum(sizes)
    from_partials = total >= throughput_from
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 1)
    ids = heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32)
    wtab = heap_ptr(bases, rank, wtab_off + parity * wtab_half, tl.float32)
    k_from = 0  # the program's own items summed in full before the barrier
    if from_partials:
        if CHUNKS > 0:
            k_from = _push_chunked(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, bases,
                                   rank, ybuf_off, ids, wtab, sizes, part_off, flags_off, e, timeout, diag, pid, grid,
                                   DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_T, BLOCK_W, CHUNKS)
        elif INTERLEAVE:
            k_from = _push_interleaved(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens,
                                       bases, rank, ybuf_off, ids, wtab, sizes, part_off, flags_off, e, timeout, diag,
                                       pid, grid, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_T, BLOCK_W)
        else:
            _push_partials(out_ptr, w_ptr, owner_ptr, row_ptr, slot_ptr, n_tokens, hidden, max_tokens, bases, rank,
                           ybuf_off, ids, wtab, sizes, part_off, pid, grid, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K,
                           BLOCK_T, BLOCK_W)
        if CHUNKS == 0:  # every peer's partial of my tokens is here
            barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    else:
        # dealt on GPUs; in the CPU world only where pushing programs are apart (they never wait there)
        _push_packets(slot_ptr, hidden, max_tokens, lamport_rows, bases, rank, ybuf_off, ids, wtab, sizes, lpart_off,
                      push_pid, push_grid, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, BLOCK_W,
                      PUSHERS > 0 or not INTERPRET)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 2)
    sum_tokens(out_ptr, w_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, lamport_rows, bases, rank, ybuf_off,
                part_off, lpart_off, from_partials, tl.where(from_partials, pid, sum_pid),
                tl.where(from_partials, grid, sum_grid), timeout, diag, WORLD, TOP_K, BLOCK_K, BLOCK_H, BLOCK_T,
                k_from)
    epoch_commit_slots(epoch_ptr, e, epoch_slots)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 3)


def launch_combine(run: Launcher, comm, channel, header: torch.Tensor, out: torch.Tensor, w: torch.Tensor,
                   owner: torch.Tensor, row: torch.Tensor, slot_of: torch.Tensor, n_tokens: int, *, max_tokens: int,
                   throughput_from: int, lamport_rows: int, local: int, ybuf_off: int, ids_off: int, ids_half: int,
                   wtab_off: int, wtab_half: int, part_off: int, lpart_off: int, block_h: int, num_warps: int,
                   launch_opts: dict[str, bool | int], trace: torch.Tensor | None = None, pushers: int = 0,
                   throughput_block_h: int = 0, interleave: bool = False, chunks: int = 0) -> None:
    """Launch ``moe_combine_kernel`` through ``run`` (its launcher, one program per SM on GPUs), after
    the dispatch that left ``header`` (``header.py``); ``trace``: int64 ``[programs,
    COMBINE_STAGES, 2]`` for the stage stamps, or None; ``pushers``: in the latency mode the
    programs that push (the others sum); 0: all; ``throughput_block_h``: the throughput mode's
    columns per step (0: ``block_h``); ``interleave``: the throughput mode interleaved (the channel
    has ``2 * programs`` barrier slots); ``chunks``: the throughput mode chunked, without its barrier
    (the channel has ``2 * programs`` barrier slots; not with ``interleave``)."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    run(out, w, owner, row, slot_of, n_tokens, out.shape[-1], max_tokens, throughput_from, lamport_rows, bases, rank,
        timeout, diag, channel.flags_off, channel.epochs_off, channel.programs, header, ybuf_off, ids_off, ids_half,
        wtab_off, wtab_half, part_off, lpart_off, w if trace is None else trace, WORLD=world,
        LOCAL=local, TOP_K=w.shape[-1], BLOCK_K=pow2_at_least(w.shape[-1]), BLOCK_W=pow2_at_least(world),
        BLOCK_H=block_h, TRACE=trace is not None, PUSHERS=pushers, BLOCK_HT=throughput_block_h,
        INTERLEAVE=bool(interleave), CHUNKS=chunks,
        num_warps=num_warps, enable_fp_fusion=False,
        **launch_opts)
