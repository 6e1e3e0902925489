"""MoE dispatch: every rank sends its routing to every rank and each token once to every rank that
holds one of its experts, and lays out its own tokens on its own experts meanwhile.

On instances of more than ``MoEShape.route_above`` routing entries (``ROUTED``),
``moe_route_kernel`` (``route.py``) runs first and leaves every rank's count, routing (int32) and
histogram rows (blocks of ``BLOCK_E`` entries and superblocks of ``SUPER`` blocks) in every rank's
tables. Program ``pid`` of the send kernel passes its barrier slot only after program ``pid`` of
every peer has arrived there, which a peer's program does after its own stores and after the
peer's route kernel has ended (``pdl_wait``: that kernel's stores performed), so past the slot the
peers' rows and routing are visible (``MoEShape.route_barrier`` adds a slot of the route kernel's
own, not needed for this). Then program ``pid`` lays out the peers' rows that program ``pid`` of
each peer sent it (``gather.lay_out_peers``: both sides split a source's rows alike), so a
program that finishes its sends early lays out while others still send, and no kernel follows. On
smaller instances every send program loads the call's whole routing, the send kernel counts and
sends the histogram rows itself, and the gather kernel lays out the peers' rows.

``moe_send_kernel``: program 0 stores the token count ``n_tokens`` into entry ``rank`` of every
rank's count table (unless the route kernel did); program ``pid`` takes the work items ``pid, pid +
grid, ...``, item ``i`` being token row ``t = i // shares`` and the ``i % shares``-th run of its
column blocks (``shares.py``; ``shares = column_shares(n_tokens)``: at decode a row's blocks spread
over programs). For each row

* its first item reads the ``TOP_K`` expert ids (-1 means "no expert"; any other id outside ``[0,
  num_experts)`` is counted in ``bad[0]``, by the route kernel if it ran, and treated as -1) and
  weights, keeps the weights for ``combine``, and stores the weights (fp32), and the ids unless the
  route kernel did, into row ``rank * max_tokens + t`` of every peer's weights and ids tables;
* every item stores its column blocks of the token into row ``(rank - (rank > d)) * max_tokens + t``
  of the receive buffer of every peer ``d`` that owns one of its experts, and into each of the
  row's slots on this rank's own experts (``route.own_slots``: a rank's own entries come first in
  its experts' slot order, so they need no peer's routing). The row's first item writes what
  ``combine`` needs of it: each entry's owner rank (``owner``, -1 with no expert), its expert-buffer
  row here (``row``, -1 unless kept on this rank) and, for this rank's experts, ``slot_of``;

all in the half given by the launch's epoch parity. The rank's own rows are thus read once, for the
peers and for its own experts, and their HBM stores run while the peers' rows cross the links.

**Direct rows** (``DIRECT``: calls whose rows come to at least ``MoEShape.direct_from_bytes``).
The route kernel ends with its barrier, so every rank's routing and histograms are in place and
every peer's stream is past its previous dispatch's readers of the expert buffer. Each row then
goes, instead of into the receive buffer, into its first kept slot (``j`` order) on each peer that
keeps one (``route.direct_earlier`` gives every owner's earlier sources), and the peer's layout
after the barrier copies it from there into its other slots only.

**Interleaved** (``INTERLEAVE``: calls of at least ``MoEShape.interleave_from`` tokens). Program
``pid`` sends the first half of its items (``shares.first_half``), arrives at a second barrier slot
``grid + pid``, sends one item more and waits there; then it alternates one item of its second half
with one item of the first half that program ``pid`` of each peer sent it, so that the layout's HBM
work runs while rows still cross the links, and lays out the rest after barrier slot ``pid``
(``lay_out_peers(REST=True)``). Every program of every rank arrives at its half slot, and a peer's
program ``pid`` arrives there in the next call only after this call's slot ``pid``, which this
program reaches after its wait: a half slot never holds the next call's epoch while it is waited on.

With ``FP8`` the token is sent as e4m3 with one fp32 scale per 128 values (``wire.to_fp8``), the
scales into the scale table's row (and beside the own slots).

Without the route kernel, program ``pid`` also counts this rank's histogram rows, tasks ``q, q +
grid, ...`` (``q = grid - 1 - pid``: at decode the programs with no token row do them), and stores
them into every rank's histogram table, from which the gather kernel places every entry without
scanning. With it, program 0 ends with the counts and problem counters (``gather.finish_counts``).

Rows at or past a source's count are never read, so they are never sent. Then the kernel arrives
at and waits on barrier slot ``pid`` (and, after the route kernel, lays out). Once the kernel has
ended on a rank, every peer's programs have made their stores (each before arriving at the barrier
its counterpart waited on), so the later steps on the stream may read the tables. A rank cannot
start launch ``n + 2`` (same parity) before every peer has passed launch ``n + 1``'s barriers, i.e.
before every peer's stream is past its reads of launch ``n``.

**Call check.** With a signature (``MoEAllToAll``: op, dtype, the shared token bound, the path) the
send kernel's barriers compare it (``kernels.barrier``): a program that finds a difference lays out
nothing more from the peers, and on the send-gather path sets every source's count in this rank's
count table to 0, so that the gather kernel lays out nothing either. Routed packets have no send
barrier: the route kernel's barrier compares the signature instead and, where it differs, sets those
counts to 0, so that the send kernel lays out nothing from the peers (``route.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import (
    barrier,
    barrier_arrive,
    barrier_wait,
    epoch_commit,
    heap_ptr,
    pow2_at_least,
    stamp,
)
from ...kernels.launcher import Launcher
from ...kernels.memory import address_ptr
from .gather import finish_counts, lay_out_items, lay_out_peers, no_counts
from .header import size_of, store_header
from .route import (
    ROUTED_STAGES,
    count_entries,
    direct_earlier,
    expert_ids,
    rows_per_load,
    rows_sum,
)
from .sends import launch_epoch, send_items
from .shares import column_shares, first_half, program_items

__all__ = ["launch_send", "moe_send_kernel"]

_STAGES = tl.constexpr(ROUTED_STAGES)


@triton.jit(do_not_specialize=["rank", "n_tokens", "ids_s0", "ids_s1", "w_s0", "w_s1"])  # one build for every call
def moe_send_kernel(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr,
                    sc_out_ptr, slot_ptr, owner_ptr, row_ptr, counts_ptr, bad_host_addr, n_tokens, hidden,
                    max_tokens, num_experts, capacity, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                    recv_off, recv_half, ids_off, ids_half, wtab_off, wtab_half, ntab_off, ntab_half, sc_off, sc_half,
                    hist_off, hist_half, hist_blocks, header_ptr, pw_off, pw_half, out_off, sc_out_off, trace_ptr,
                    sig, WORLD: tl.constexpr, LOCAL: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_B: tl.constexpr,
                    SUPER: tl.constexpr, FP8: tl.constexpr, ROUTED: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_W: tl.constexpr, PACKETS: tl.constexpr = False, TRACE: tl.constexpr = False,
                    DIRECT: tl.constexpr = False, LOOKAHEAD: tl.constexpr = False, PAIRS: tl.constexpr = False,
                    INTERLEAVE: tl.constexpr = False):
    """See the module docstring. With ``PACKETS`` (``ROUTED`` only) the receive buffer (and its
    scales) and the weights table at ``pw_off`` are Lamport buffers at rest: the rows and weights go
    out as packets, to the peers that own one of the row's experts, and program ``pid`` lays out the
    peers' rows as they arrive (``place_packets``), without the barrier. With ``TRACE`` (``ROUTED``)
    each program stamps (``kernels.stamp``) stages 3-10 of ``route.ROUTED_STAGES`` into ``trace_ptr``.
    With ``DIRECT`` (``ROUTED``, after the route kernel's own barrier: every rank's routing is in
    place and every peer's stream is past its previous dispatch's readers) each row goes straight
    into its first kept slot on each peer's expert buffer (heap offsets ``out_off``, ``sc_out_off``),
    and the layout copies it from there into the row's other slots. ``LOOKAHEAD``: the sends' loads
    one column block ahead (``send_items``). ``PAIRS``: the layout takes whole rows two at a time
    (``gather.lay_out_peers``). ``INTERLEAVE`` (``ROUTED``, not ``PACKETS``; barrier slots ``grid +
    pid`` too): program ``pid`` sends the first half of its items (``shares.first_half``), arrives
    at slot ``grid + pid``, sends one item more, waits there (after which the peers' counts,
    routing and first halves are visible: read nothing of theirs before), then alternates one item
    of its second half with one item of the first half that each peer's program ``pid`` sent it
    (peer by peer in this rank's order), so that the layout's HBM work runs while its rows cross
    the links; then barrier slot ``pid`` and the rest of the peers' rows.

    ``sig`` (None: no call check): the call's signature, compared at the barriers (module docstring,
    "Call check"); a program that finds a difference lays out nothing more."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    DTYPE: tl.constexpr = tl.float8e4nv if FP8 else x_ptr.dtype.element_ty
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e, half = launch_epoch(bases, rank, epochs_off)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 3)
    recv_base = recv_off + half * recv_half
    ids_base = ids_off + half * ids_half
    sc_base = sc_off + half * sc_half
    wtab_base = wtab_off + half * wtab_half
    hist_base = hist_off + half * hist_half
    hist = heap_ptr(bases, rank, hist_base, tl.int32)
    if (pid == 0) & (not ROUTED):  # else the route kernel did
        for d in tl.static_range(WORLD):
            tl.store(heap_ptr(bases, d, ntab_off + half * ntab_half, tl.int32, ALIGNED=False) + rank, n_tokens)
    if ROUTED:
        routing, nn = 0, 0
    else:  # few entries: every program holds the whole routing and finds its own rows' slots in it
        nn = tl.arange(0, BLOCK_N)
        live = nn < n_tokens * TOP_K
        routing, _ = expert_ids(ids_ptr + (nn // TOP_K).to(tl.int64) * ids_s0 + (nn % TOP_K) * ids_s1, live,
                                num_experts)
    ntab = heap_ptr(bases, rank, ntab_off + half * ntab_half, tl.int32)
    if DIRECT:  # per expert, the entries its owner places before this rank's
        earlier = direct_earlier(hist, ntab, rank, hist_blocks, WORLD, LOCAL, TOP_K, BLOCK_E, BLOCK_X, BLOCK_B,
                                 SUPER)
    else:
        earlier = 0
    if INTERLEAVE:  # the first half, the half slot, then the second half with the peers' first halves
        mine = n_tokens * column_shares(n_tokens, hidden, grid, BLOCK_H)  # this rank's items
        k1 = first_half(mine, pid, grid)
        send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr, sc_out_ptr,
                   slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts, capacity, bases, rank, pid,
                   grid, recv_base, max_tokens, ids_base, wtab_base, sc_base, routing, nn, hist, hist_blocks, DTYPE,
                   WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, False, False, True, BLOCK_E, BLOCK_X, BLOCK_B, SUPER,
                   False, out_off, sc_out_off, earlier, DIRECT, LOOKAHEAD, 0, k1)
        barrier_arrive(bases, rank, WORLD, flags_off, grid + pid, e, sig)
        # one more item in flight, then the wait: the peers' counts, routing and first halves are
        # visible only after it (without the route kernel's barrier)
        send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr, sc_out_ptr,
                   slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts, capacity, bases, rank, pid,
                   grid, recv_base, max_tokens, ids_base, wtab_base, sc_base, routing, nn, hist, hist_blocks, DTYPE,
                   WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, False, False, True, BLOCK_E, BLOCK_X, BLOCK_B, SUPER,
                   False, out_off, sc_out_off, earlier, DIRECT, LOOKAHEAD, k1, k1 + 1)
        ok = barrier_wait(bases, rank, WORLD, flags_off, grid + pid, e, timeout, diag, sig)
        ws = tl.arange(0, BLOCK_W)
        sizes = tl.load(ntab + ws, mask=ws < WORLD, other=0)
        super_blocks = tl.cdiv(hist_blocks, SUPER)
        before = rows_sum(hist, WORLD * hist_blocks + rank * super_blocks,  # per expert: the sources before s
                          tl.cdiv(tl.cdiv(n_tokens * TOP_K, BLOCK_E), SUPER), BLOCK_B, BLOCK_X)
        rest = tl.maximum(program_items(mine, pid, grid) - k1 - 1, 0)  # the second half past the extra item
        for i in range(1, tl.where(ok, WORLD, 1)):  # nothing laid out after a mismatch
            s = (rank + i) % WORLD
            n_s = size_of(sizes, s, BLOCK_W)
            shares_s = column_shares(n_s, hidden, grid, BLOCK_H)
            half_s = first_half(n_s * shares_s, pid, grid)
            a = k1 + 1 + rest * (i - 1) // (WORLD - 1)  # this peer's share of the second half's sends
            b = k1 + 1 + rest * i // (WORLD - 1)
            for j in range(0, tl.maximum(b - a, half_s)):
                send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr,
                           sc_out_ptr, slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts,
                           capacity, bases, rank, pid, grid, recv_base, max_tokens, ids_base, wtab_base, sc_base,
                           routing, nn, hist, hist_blocks, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, False,
                           False, True, BLOCK_E, BLOCK_X, BLOCK_B, SUPER, False, out_off, sc_out_off, earlier, DIRECT,
                           LOOKAHEAD, a + j, tl.minimum(a + j + 1, b))
                item = pid + j * grid
                lay_out_items(out_ptr, sc_out_ptr, slot_ptr, heap_ptr(bases, rank, recv_base, DTYPE),
                              heap_ptr(bases, rank, sc_base, tl.float32), heap_ptr(bases, rank, ids_base, tl.int32),
                              hist, hist_blocks, max_tokens, capacity, hidden, rank, s, n_s, shares_s, before, item,
                              tl.where(j < half_s, item + 1, item), grid, 0, 0, timeout, diag, WORLD, LOCAL, TOP_K,
                              BLOCK_K, BLOCK_H, FP8, BLOCK_E, BLOCK_X, BLOCK_B, SUPER, False, DIRECT)
            before += rows_sum(hist, WORLD * hist_blocks + s * super_blocks,
                               tl.cdiv(tl.cdiv(n_s * TOP_K, BLOCK_E), SUPER), BLOCK_B, BLOCK_X)
    else:
        send_items(x_ptr, x_stride, ids_ptr, ids_s0, ids_s1, w_ptr, w_s0, w_s1, wts_ptr, bad_ptr, out_ptr, sc_out_ptr,
                   slot_ptr, owner_ptr, row_ptr, n_tokens, hidden, max_tokens, num_experts, capacity, bases, rank, pid,
                   grid, recv_base, max_tokens, ids_base, pw_off + half * pw_half if PACKETS else wtab_base, sc_base,
                   routing, nn, hist, hist_blocks, DTYPE, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, not ROUTED,
                   not ROUTED, ROUTED, BLOCK_E, BLOCK_X, BLOCK_B, SUPER, PACKETS, out_off, sc_out_off, earlier, DIRECT,
                   LOOKAHEAD)
    if not ROUTED:  # this rank's histogram rows, counted here, to every rank
        xs = tl.arange(0, BLOCK_X)
        n_blocks = tl.cdiv(n_tokens * TOP_K, BLOCK_E)
        for u in range(grid - 1 - pid, n_blocks + tl.cdiv(n_blocks, SUPER), grid):  # the last programs: idle at decode
            if u < n_blocks:
                h = count_entries(ids_ptr, ids_s0, ids_s1, u * BLOCK_E, n_tokens * TOP_K, num_experts, BLOCK_E,
                                  TOP_K, BLOCK_X)
                hrow = rank * hist_blocks + u
            else:
                h = count_entries(ids_ptr, ids_s0, ids_s1, (u - n_blocks) * SUPER * BLOCK_E, n_tokens * TOP_K,
                                  num_experts, SUPER * BLOCK_E, TOP_K, BLOCK_X)
                hrow = WORLD * hist_blocks + rank * tl.cdiv(hist_blocks, SUPER) + u - n_blocks
            for d in tl.static_range(WORLD):
                tl.store(heap_ptr(bases, d, hist_base, tl.int32) + tl.cast(hrow, tl.int64) * BLOCK_X + xs, h)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 4)
    same = tl.full([], 1, tl.int1)
    if not PACKETS:
        same = barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig)
    if not ROUTED:
        if not same:  # every source's count to 0: the gather kernel after this one lays out nothing
            ws = tl.arange(0, BLOCK_W)
            tl.store(ntab + ws, tl.zeros([BLOCK_W], tl.int32), mask=ws < WORLD)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 5)
    if ROUTED:  # every rank's routing came before this kernel: program pid lays out what it was sent
        if same:  # nothing laid out after a mismatch
            pw = heap_ptr(bases, rank, pw_off + half * pw_half, tl.float32)  # with PACKETS: the peers' weights
            totals = lay_out_peers(out_ptr, sc_out_ptr, slot_ptr, heap_ptr(bases, rank, recv_base, DTYPE),
                                   heap_ptr(bases, rank, sc_base, tl.float32),
                                   heap_ptr(bases, rank, ids_base, tl.int32), ntab, hist, hist_blocks, max_tokens,
                                   capacity, hidden, rank, pid, grid, pw, heap_ptr(bases, rank, wtab_base, tl.float32),
                                   timeout, diag, WORLD, LOCAL, TOP_K, BLOCK_K, BLOCK_H, FP8, BLOCK_E, BLOCK_X,
                                   BLOCK_B, SUPER, PACKETS, BLOCK_W, DIRECT, PAIRS, trace_ptr, pid * _STAGES + 7,
                                   TRACE, INTERLEAVE)
            if pid == 0:
                finish_counts(counts_ptr, bad_ptr, bad_host_addr, totals, capacity, rank, 0, LOCAL, BLOCK_X)
                ws = tl.arange(0, BLOCK_W)
                store_header(header_ptr, tl.load(ntab + ws, mask=ws < WORLD, other=0), half, BLOCK_W)
        elif pid == 0:
            no_counts(counts_ptr, header_ptr, half, LOCAL, BLOCK_X, BLOCK_W)
    if TRACE:
        stamp(trace_ptr, pid * _STAGES + 6)
    epoch_commit(epoch_ptr, e)


def launch_send(run: Launcher, comm, channel, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                wts: torch.Tensor, bad: torch.Tensor, out: torch.Tensor, scales: torch.Tensor | None,
                slot_of: torch.Tensor, owner: torch.Tensor, row: torch.Tensor, counts: torch.Tensor,
                bad_host_addr: int, *, max_tokens: int, num_experts: int,
                capacity: int, local: int, recv_off: int, recv_half: int, ids_off: int, ids_half: int, wtab_off: int,
                wtab_half: int, ntab_off: int, ntab_half: int, sc_off: int, sc_half: int, hist_off: int,
                hist_half: int, hist_blocks: int, block_h: int, block_e: int, block_x: int, super_blocks: int,
                routed: bool, block_n: int, num_warps: int, launch_opts: dict[str, bool | int],
                header: torch.Tensor, pw_off: int = 0, pw_half: int = 0, packets: bool = False,
                trace: torch.Tensor | None = None, direct: tuple[int, int] | None = None,
                lookahead: bool = False, pairs: bool = False, interleave: bool = False,
                sig: int | None = None) -> None:
    """Launch ``moe_send_kernel`` through ``run`` (its launcher, one program per SM on GPUs): with
    ``routed`` after ``route.launch_route`` on the same grid (and then leaving ``header`` for
    ``combine``, ``header.py``), else holding the routing in blocks of ``block_n`` entries (at least
    the call's). With ``packets`` (routed only) ``recv_off``, ``sc_off`` and ``pw_off`` are the packet
    buffers (``MoEShape.routed_packets``). ``trace`` (routed only): int64 ``[programs,
    route.ROUTED_STAGES, 2]`` for the stage stamps, or None. ``direct`` (routed, after the route
    kernel with its barrier): the heap offsets of ``out`` and ``scales`` (0 without FP8), into which
    the rows then go on the peers, or None. ``pairs``: the routed layout takes whole rows two at a
    time; ``interleave`` (routed, plain buffers; the channel has ``2 * programs`` barrier slots):
    the peers' first halves laid out while the second half is sent. ``sig``: the call's signature
    (``MoEAllToAll``), compared at the barriers, or None."""
    bases, rank, world, timeout, diag = comm.kernel_args()
    k = ids.shape[1]
    fp8 = scales is not None
    run(x, x.stride(0), ids, ids.stride(0), ids.stride(1), weights, weights.stride(0), weights.stride(1), wts,
        bad, out, scales if fp8 else out, slot_of, owner, row, counts, bad_host_addr, x.shape[0], x.shape[1],
        max_tokens, num_experts, capacity, bases, rank, timeout, diag, channel.flags_off, channel.epochs_off,
        recv_off, recv_half, ids_off, ids_half, wtab_off, wtab_half, ntab_off, ntab_half, sc_off, sc_half, hist_off,
        hist_half, hist_blocks, header, pw_off, pw_half, *(direct or (0, 0)), bad if trace is None else trace, sig,
        WORLD=world, LOCAL=local, TOP_K=k, BLOCK_K=pow2_at_least(k), BLOCK_H=block_h, BLOCK_E=block_e,
        BLOCK_X=block_x, BLOCK_B=rows_per_load(block_x), SUPER=super_blocks, FP8=fp8, ROUTED=routed,
        BLOCK_N=1 if routed else block_n, BLOCK_W=pow2_at_least(world), PACKETS=packets, TRACE=trace is not None,
        DIRECT=direct is not None, LOOKAHEAD=bool(lookahead), PAIRS=bool(pairs),
        INTERLEAVE=bool(interleave) and routed and not packets,
        num_warps=num_warps,
        **launch_opts)
