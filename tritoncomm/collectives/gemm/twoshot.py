"""Row-parallel GEMM with a two-shot all-reduce folded into its epilogue, in one persistent kernel.

``out = sum over ranks of (a @ w.T)`` for ``a`` (M x K, this rank's slice of the input features)
and ``w`` (N x K, this rank's slice of the weight's columns), as a row-parallel linear layer needs.

The GEMM is a persistent TMA kernel (``BM x BN`` output tiles in grouped order, fp32 accumulation,
operands loaded through tensor descriptors, rows and columns past the edges read as zero). Its
``T`` tiles are cut into ``W`` contiguous chunks; chunk ``c`` is *owned* by rank ``c``. A tile's
product is rounded to the input dtype (a *partial*), and then:

1. **Reduce-scatter in the epilogue.** A rank stores the partial of a tile it does not own into the
   owner's ``recv`` slot [tile, my rank] (NVLink stores) and ``signal``s the slot's flag there
   (release, system scope). Nothing waits.
2. **Reduce at the owner.** For a tile it owns, a rank stores its own partial into its own slot,
   ``wait``s until every peer's flag of that tile holds this launch's epoch (acquire), sums the
   ``W`` partials in rank order 0..W-1 in fp32 (all from local memory), rounds, and writes the sum
   to its output and to every peer's (straight into their registered outputs with ``OUT_REG``,
   else into their ``fin`` slot [tile]); then it ``signal``s the tile's final flag at every rank.
3. **All-gather completes.** After its last tile a program waits for the final flag of each tile it
   made a partial for and does not own (and, without ``OUT_REG``, copies that tile from ``fin`` into
   its output). So when the kernel ends, this rank's output is whole.

Every rank walks the tiles in the same rotation of one order, starting at the chunk of rank
``rank + 1``: its own chunk comes *last*. Two consequences. A peer makes the partials of my chunk
before its own chunk, so by the time I reduce a tile the partials have usually arrived and the
reduction rides in the epilogue while the GEMM keeps computing; only the last wave's
finals are exposed. And nothing waits in a cycle: waits in step 2 depend only on step-1 work, which
never waits, and waits in step 3 only on step-2 work. On the GPU every program must be resident
(the grid is at most one program per SM; kernels of other streams may delay, not deadlock, it only
while they run to completion). The CPU interpreter runs a grid's programs one after another, so the
host launches one program per rank there: it walks the whole rotation itself.

Bits: every tile's sum is made once, by its owner, over rounded partials in rank order, and copied to
everyone: the same bits on every rank, equal to an all-reduce (fixed order) of the rounded products,
whichever rank owns the tile.

Buffer reuse: rank r writes into a peer's ``recv`` (``fin``, or its output) for launch k+1 only
after that peer's launch k finished, because (a) a partial of launch k+1 is made inside launch k+1
and (b) the owner's step 2 of launch k+1 waits for every peer's partial of launch k+1. And a peer's
launch k finishes only after it has seen my finals of launch k, which I published after reading my
``recv`` slots of launch k. So one copy of each buffer suffices. Flags carry the launch's epoch.

Call check: with ``sig`` (the call's packed signature, ``kernels.consistency.pack_signature``) every
program sends it to the same program of every peer as it starts (``barrier_arrive`` on its own header
slot), and compares every rank's with its own (``barrier_wait``) just before its first wait, by which
time the headers have long arrived, so the GEMM of the first tiles never waits for them. Every write
into an output, its own or a peer's, comes after the writing program's comparison; a program that
finds a difference records it, writes nothing into any output and waits for nothing more. Every
program of every rank compares every rank's signature, so every rank that computes a tile finds the
mismatch, whatever the tile counts of the calls. The header slots alternate by epoch parity, as the
barrier's: a peer cannot send launch k+2's header before this rank has started launch k+2 (its launch
k+1 ends only after every rank's partials of launch k+1 are made).

Workspace per rank: ``recv`` ceil(T / W) x W tiles and ``fin`` T tiles (about twice the output),
plus one flag per (owned tile, source) and per tile, and a header slot per program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import INTERPRET, epoch_commit, heap_base, heap_ptr, next_pow2, program_epoch, round_to, signal, wait
from ...kernels.barrier import barrier_arrive, barrier_wait
from ...kernels.memory import address_ptr

__all__ = ["chunk_start", "gemm_twoshot_kernel", "grouped_tile", "tile_owner"]


@triton.jit
def grouped_tile(t, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of tile ``t`` in grouped order (``GROUP_M`` row blocks share columns,
    so neighbouring tiles reuse operands in L2)."""
    pm = tl.cdiv(M, BM)
    pn = tl.cdiv(N, BN)
    per_group = GROUP_M * pn
    first = (t // per_group) * GROUP_M
    size = tl.minimum(pm - first, GROUP_M)
    return first + (t % per_group) % size, (t % per_group) // size


@triton.jit
def chunk_start(c, T, WORLD: tl.constexpr):
    """First tile of rank ``c``'s chunk (chunks: ``[c*T//W, (c+1)*T//W)``)."""
    return c * T // WORLD


@triton.jit
def tile_owner(t, T, WORLD: tl.constexpr):
    """The rank whose chunk holds tile ``t`` (the inverse of ``chunk_start``)."""
    return ((t + 1) * WORLD + T - 1) // T - 1


@triton.jit
def _tile_product(a_desc, w_desc, bm, bn, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One ``BM x BN`` tile of ``a @ w.T`` in fp32, operands through TMA (zero past the edges)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([bm * BM, k * BK])
        b = w_desc.load([bn * BN, k * BK])
        if INTERPRET:  # the interpreter's bf16 dot multiplies raw bits; fp32 products of bf16 are exact
            acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def _out_strip(bm, bn, r0, M, N, BM: tl.constexpr, BN: tl.constexpr, RB: tl.constexpr):
    """Offsets of strip ``r0 .. r0+RB`` of a tile, in a dense tile slot and in the ``M x N`` output,
    and the output's mask."""
    rows = r0 + tl.arange(0, RB)
    cols = tl.arange(0, BN)
    dense = rows[:, None] * BN + cols[None, :]
    grow = (bm * BM + rows).to(tl.int64)
    gcol = bn * BN + cols
    return dense, grow[:, None] * N + gcol[None, :], (grow[:, None] < M) & (gcol[None, :] < N)


@triton.jit
def _publish(t, T, bases, rank, pflags_off, fflags_off, e, WORLD: tl.constexpr):
    """Signal what the epilogue of tile ``t`` stored: its partial, to the owner (step 1), or, when
    this rank owns it, the reduced tile, to every rank (step 2)."""
    owner = tile_owner(t, T, WORLD)
    if owner != rank:
        li = t - chunk_start(owner, T, WORLD)
        signal(heap_ptr(bases, owner, pflags_off, tl.uint32) + li * WORLD + rank, e)
    else:
        lanes = tl.arange(0, next_pow2(WORLD))
        everyone = tl.where(lanes < WORLD, lanes, rank)
        signal((heap_base(bases, everyone) + fflags_off + t * 4).to(tl.pointer_type(tl.uint32)), e)


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def gemm_twoshot_kernel(a_desc, w_desc, out_ptr, out_tab, M, N, K, bases, rank, timeout, diag_addr, epochs_off,
                        pflags_off, fflags_off, recv_off, fin_off, hdr_off, sig, WORLD: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, RB: tl.constexpr,
                        OUT_REG: tl.constexpr, COMM: tl.constexpr = True, DEFER: tl.constexpr = False):
    """See the module docstring. ``pflags_off``: ``ceil(T/W) x W`` uint32 flags (slot = owned tile
    x W + source); ``fflags_off``: ``T`` flags; ``recv_off`` / ``fin_off``: tile slots of ``BM x BN``
    elements. ``out_tab``: the address of ``out``'s registered row (with ``OUT_REG``). Without
    ``COMM`` the kernel is the bare GEMM (``out = a @ w.T`` on this rank), for measurements.
    ``hdr_off``: the programs' header slots (barrier entries, one slot per program); ``sig``: the
    call's signature, or None for no call check (module docstring).

    ``DEFER``: publish a tile's stores (the ``signal``, a system-scope release that waits until
    the NVLink stores before it have landed) after the *next* tile's product instead of right
    after the stores, so that the wait overlaps nothing but finished work. Always before any wait
    of this program, so the argument against cycles holds."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    TILE: tl.constexpr = BM * BN
    W2: tl.constexpr = next_pow2(WORLD)
    diag = address_ptr(diag_addr, tl.int64)
    T = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    lanes = tl.arange(0, W2)
    if COMM:
        epoch_ptr, e = program_epoch(bases, rank, epochs_off)
        first = chunk_start((rank + 1) % WORLD, T, WORLD)
        if sig is not None:  # my header, to this program of every rank
            barrier_arrive(bases, rank, WORLD, hdr_off, pid, e, sig)
    else:
        first = 0
    checked = tl.full([], 0, tl.int1)  # whether this program has compared the headers (before its first wait)
    ok = tl.full([], 1, tl.int1)  # whether every rank's signature equals mine (True until compared, and without sig)
    pend = -1  # with DEFER: the tile whose stores this program has not yet published
    for v in range(pid, T, progs):
        t = v + first
        if t >= T:
            t -= T
        bm, bn = grouped_tile(t, M, N, BM, BN, GROUP_M)
        part = round_to(_tile_product(a_desc, w_desc, bm, bn, K, BM, BN, BK), DTYPE)
        if not COMM:
            rows = (bm * BM + tl.arange(0, BM)).to(tl.int64)
            cols = bn * BN + tl.arange(0, BN)
            tl.store(out_ptr + rows[:, None] * N + cols[None, :], part,
                     mask=(rows[:, None] < M) & (cols[None, :] < N))
        else:
            if DEFER:
                if pend >= 0:
                    _publish(pend, T, bases, rank, pflags_off, fflags_off, e, WORLD)
            owner = tile_owner(t, T, WORLD)
            li = t - chunk_start(owner, T, WORLD)
            dense = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
            mine = (li * WORLD + rank).to(tl.int64)
            tl.store(heap_ptr(bases, owner, recv_off, DTYPE) + mine * TILE + dense, part)  # 1. partial -> owner
            if sig is not None:
                if owner == rank:
                    if not checked:
                        ok = barrier_wait(bases, rank, WORLD, hdr_off, pid, e, timeout, diag, sig)
                        checked = tl.full([], 1, tl.int1)
            if owner == rank and ok:  # 2. I own the tile: every partial, then the sum to everyone
                peers = tl.where((lanes < WORLD) & (lanes != rank), lanes, (rank + 1) % WORLD)
                tl.debug_barrier()  # my own partial, stored by all my threads, before anyone reads it
                wait(heap_ptr(bases, rank, pflags_off, tl.uint32) + li * WORLD + peers, e, peers, t, rank, timeout,
                     diag)
                slots = heap_ptr(bases, rank, recv_off, DTYPE) + li.to(tl.int64) * WORLD * TILE
                for r0 in range(0, BM, RB):
                    d, g, m = _out_strip(bm, bn, r0, M, N, BM, BN, RB)
                    acc = tl.zeros((RB, BN), dtype=tl.float32)
                    for s in tl.static_range(WORLD):
                        acc += tl.load(slots + s * TILE + d).to(tl.float32)
                    red = round_to(acc, DTYPE)
                    tl.store(out_ptr + g, red, mask=m)
                    for s in tl.static_range(WORLD):
                        if s != rank:
                            if OUT_REG:
                                row_tab = address_ptr(out_tab, tl.int64)
                                tl.store(heap_ptr(row_tab, s, 0, DTYPE) + g, red, mask=m)
                            else:
                                tl.store(heap_ptr(bases, s, fin_off, DTYPE) + t.to(tl.int64) * TILE + d, red)
            if DEFER:
                pend = t
            else:
                _publish(t, T, bases, rank, pflags_off, fflags_off, e, WORLD)
    if COMM:  # 3. the tiles I sent away come back reduced
        if DEFER:
            if pend >= 0:
                _publish(pend, T, bases, rank, pflags_off, fflags_off, e, WORLD)
        for v in range(pid, T, progs):
            t = v + first
            if t >= T:
                t -= T
            owner = tile_owner(t, T, WORLD)
            if sig is not None:
                if owner != rank:
                    if not checked:
                        ok = barrier_wait(bases, rank, WORLD, hdr_off, pid, e, timeout, diag, sig)
                        checked = tl.full([], 1, tl.int1)
            if owner != rank and ok:
                wait(heap_ptr(bases, rank, fflags_off, tl.uint32) + t, e, owner, t, rank, timeout, diag)
                if not OUT_REG:
                    bm, bn = grouped_tile(t, M, N, BM, BN, GROUP_M)
                    fin = heap_ptr(bases, rank, fin_off, DTYPE) + t.to(tl.int64) * TILE
                    for r0 in range(0, BM, RB):
                        d, g, m = _out_strip(bm, bn, r0, M, N, BM, BN, RB)
                        tl.store(out_ptr + g, tl.load(fin + d), mask=m)
        epoch_commit(epoch_ptr, e)
