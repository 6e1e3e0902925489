"""Two-shot all-reduce: reduce-scatter then all-gather, both pushed over NVLink, in one kernel.

The input is cut into ``W`` shards of ``S`` elements; rank ``s`` owns shard ``s``.

1. Every rank pushes block ``b`` of shard ``s`` to rank ``s`` (slot [my rank] of its ``rs`` buffer).
2. Barrier between matching programs (release/acquire: the pushes are visible).
3. Every rank sums its shard's block over ranks 0..W-1 in that order (its own part read locally),
   writes it to its output and pushes it to every peer (slot [my rank] of their ``ag`` buffer).
4. Second barrier; then every rank copies the other shards' blocks from its ``ag`` buffer.

Zero-copy form, when the output lives in the symmetric heap (``Communicator.empty``) at the same
offset on every rank (``OUT_HEAP``): step 3 writes the reduced block straight into every rank's
output and step 4 disappears. It is safe in place (``out`` = ``x``): rank ``s`` writes shard ``s``
of a peer's tensor only after the first barrier, which that peer reaches after pushing (reading)
its own shard ``s``, and nobody returns (and reuses its tensor) before the second barrier. The
input is always pushed, even when it lives in the heap: reading the shard from every peer's input
instead (no step 1) measured slower, and so did pulls over NVLink on their own (``docs/algorithms.md``,
"Push, not pull").

Registered form (``OUT_REG``): the output is a regular tensor that every rank registered
(``Communicator.register`` or ``graph_capture``); ``out_tab`` is the address of its table row, the
addresses of every rank's corresponding output. Step 3 stores through the row instead of the heap
offset, and step 4 disappears, with the same safety argument.

Program ``pid`` handles blocks ``pid, pid + P, ...`` of every shard on every rank, so each barrier
is between matching programs. No buffer needs a second copy by parity: a rank's pushes of launch
k+1 into a peer's ``rs`` (``ag``) buffer come after the second (first) barrier of launch k+1's
predecessor chain has shown that peer to be past its reads of launch k. Workspace: 2 x W x S
elements (about twice the largest input).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...errors import InvalidInputError
from ...kernels import (
    assume_multiple,
    barrier,
    barrier_arrive,
    barrier_wait,
    epoch_commit,
    heap_ptr,
    next_pow2,
    pow2_divisor,
    program_epoch,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm

__all__ = ["TWOSHOT_ROUNDS", "TWOSHOT_ROUND_MIN_ITERS", "TwoShot", "twoshot_allreduce_kernel", "twoshot_gather_block",
           "twoshot_reduce_block", "twoshot_scatter_block"]


@triton.jit
def twoshot_scatter_block(x_ptr, n, shard, b, bases, rank, rs_off, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Push block ``b`` of every other rank's shard of ``x`` to that rank (``rs`` slot [rank]).

    One 2-D access per side (a row per rank): every load is issued before the first store, where
    a loop of W-1 load->store pairs would wait for each load in turn."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    W2: tl.constexpr = next_pow2(WORLD)
    s = tl.arange(0, W2)
    j = b * BLOCK + tl.arange(0, BLOCK)
    idx = s[:, None] * shard + j[None, :]
    m = (j[None, :] < shard) & (idx < n) & (s[:, None] < WORLD) & (s[:, None] != rank)
    v = tl.load(x_ptr + idx, mask=m)
    dst = heap_ptr(bases, tl.where(s < WORLD, s, rank), rs_off + rank * shard * (DTYPE.primitive_bitwidth // 8),
                   DTYPE)
    tl.store(dst[:, None] + j[None, :], v, mask=m)


@triton.jit
def twoshot_reduce_block(x_ptr, out_ptr, n, shard, b, bases, rank, rs_off, ag_off, WORLD: tl.constexpr,
                         BLOCK: tl.constexpr, out_off=0, OUT_HEAP: tl.constexpr = False, out_tab=0,
                         OUT_REG: tl.constexpr = False):
    """Sum block ``b`` of my shard over ranks 0..W-1 (mine from ``x``, the others from ``rs``), write
    it to ``out`` and push it to every peer (``ag`` slot [rank]; with ``OUT_HEAP`` their outputs
    at heap offset ``out_off``; with ``OUT_REG`` their outputs listed at address ``out_tab``)."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    j = b * BLOCK + tl.arange(0, BLOCK)
    slot_bytes = shard * (DTYPE.primitive_bitwidth // 8)
    idx = rank * shard + j
    m = (j < shard) & (idx < n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(WORLD):
        if s == rank:
            acc += tl.load(x_ptr + idx, mask=m).to(tl.float32)
        else:
            acc += tl.load(heap_ptr(bases, rank, rs_off + s * slot_bytes, DTYPE) + j, mask=m).to(tl.float32)
    red = round_to(acc, DTYPE)
    for s in tl.static_range(WORLD):
        if s != rank:
            if OUT_HEAP:
                tl.store(heap_ptr(bases, s, out_off, DTYPE) + idx, red, mask=m)
            elif OUT_REG:
                tl.store(heap_ptr(address_ptr(out_tab, tl.int64), s, 0, DTYPE) + idx, red, mask=m)
            else:
                tl.store(heap_ptr(bases, s, ag_off + rank * slot_bytes, DTYPE) + j, red, mask=m)
    tl.store(out_ptr + idx, red, mask=m)


@triton.jit
def twoshot_gather_block(out_ptr, n, shard, b, bases, rank, ag_off, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Copy block ``b`` of every other rank's reduced shard from ``ag`` into ``out`` (one 2-D
    load, then one 2-D store, as in ``twoshot_scatter_block``)."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    W2: tl.constexpr = next_pow2(WORLD)
    s = tl.arange(0, W2)
    j = b * BLOCK + tl.arange(0, BLOCK)
    idx = s[:, None] * shard + j[None, :]
    m = (j[None, :] < shard) & (idx < n) & (s[:, None] < WORLD) & (s[:, None] != rank)
    v = tl.load(heap_ptr(bases, rank, ag_off, DTYPE) + idx, mask=m)
    tl.store(out_ptr + idx, v, mask=m)


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def twoshot_allreduce_kernel(x_ptr, out_ptr, n, shard, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                             rs_off, ag_off, active, out_off, out_tab, sig, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                             OUT_HEAP: tl.constexpr = False, OUT_REG: tl.constexpr = False, NDIV: tl.constexpr = 1,
                             ROUNDS: tl.constexpr = 1):
    """Sum ``n`` elements (a multiple of ``NDIV``) over the ranks into ``out_ptr`` (may equal
    ``x_ptr``); ``shard`` elements per rank (a multiple of 16); programs ``>= active`` only keep
    their epoch in step. ``out_off``: the heap offset of ``out`` (16-byte aligned),
    used with ``OUT_HEAP``; ``out_tab``: the address of ``out``'s registered row, used with
    ``OUT_REG`` (every listed output 16-byte aligned).

    ``ROUNDS`` > 1 cuts each program's blocks into that many rounds, each with its own pair of
    barriers, and copies round c-1 out while round c's all-gather pushes drain over NVLink (the
    arrive that ends round c, a release, comes after that copy). Barrier slots: ``pid + k * grid``
    for k < 2 x ROUNDS, so the channel needs 2 x ROUNDS x grid slots. The reuse argument of the
    module docstring holds per round: a rank pushes into a peer's ``rs``/``ag`` blocks of launch
    k+1 only after that peer has arrived at a barrier of launch k+1. ``sig``: the call's signature,
    compared at the first barrier; where a rank's differs nothing more is pushed or written."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(shard, BLOCK) - pid, active)
        grid = tl.num_programs(0)
        for c in tl.static_range(ROUNDS):
            lo = iters * c // ROUNDS
            hi = iters * (c + 1) // ROUNDS
            for i in range(lo, hi):  # 1. reduce-scatter push
                twoshot_scatter_block(x_ptr, n, shard, pid + i * active, bases, rank, rs_off, WORLD, BLOCK)
            if c == 0:
                if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
                    iters = iters * 0  # a rank called another collective: push and write nothing more
                    hi = hi * 0
            else:
                barrier(bases, rank, WORLD, flags_off, pid + (2 * c) * grid, e, timeout, diag)
            for i in range(lo, hi):  # 2. reduce my shard, write it out, push it to every peer
                twoshot_reduce_block(x_ptr, out_ptr, n, shard, pid + i * active, bases, rank, rs_off, ag_off, WORLD,
                                     BLOCK, out_off, OUT_HEAP, out_tab, OUT_REG)
            if c > 0:  # 3. (previous round) gather the other shards while this round's pushes drain
                barrier_wait(bases, rank, WORLD, flags_off, pid + (2 * c - 1) * grid, e, timeout, diag)
                if not (OUT_HEAP or OUT_REG):
                    for i in range(iters * (c - 1) // ROUNDS, lo):
                        twoshot_gather_block(out_ptr, n, shard, pid + i * active, bases, rank, ag_off, WORLD, BLOCK)
            barrier_arrive(bases, rank, WORLD, flags_off, pid + (2 * c + 1) * grid, e)
        barrier_wait(bases, rank, WORLD, flags_off, pid + (2 * ROUNDS - 1) * grid, e, timeout, diag)
        if not (OUT_HEAP or OUT_REG):
            for i in range(iters * (ROUNDS - 1) // ROUNDS, iters):  # 3. (last round)
                twoshot_gather_block(out_ptr, n, shard, pid + i * active, bases, rank, ag_off, WORLD, BLOCK)
    epoch_commit(epoch_ptr, e)


#: The two-shot copies round c-1 out while round c's pushes drain (``twoshot_allreduce_kernel``); by
#: default it runs this many rounds when program 0 has at least ``TWOSHOT_ROUND_MIN_ITERS`` blocks per
#: round, else one (``docs/algorithms.md``, "Two-shot rounds"). ``Choice.rounds`` overrides it.
TWOSHOT_ROUNDS = 4
TWOSHOT_ROUND_MIN_ITERS = 4


class TwoShot(AllReduceAlgorithm):
    """Launcher of ``twoshot_allreduce_kernel``. Workspace: ``rs`` and ``ag``, W shard slots each
    (about 2 x the capacity), and 2 x ``TWOSHOT_ROUNDS`` barrier slots per program."""

    name = "twoshot"
    kernel = twoshot_allreduce_kernel
    shapes = MappingProxyType({"cuda": (64, 4096, 8), "cpu": (2, 2048, 1)})
    writes_peer_outputs = True

    def layout(self) -> Workspace:
        self.shard_cap = round_up(cdiv(self.capacity, self.world) + 128, 256)  # bytes per rank slot
        return Workspace(barrier_slots=2 * TWOSHOT_ROUNDS * self.grid, buffer_bytes=2 * self.world * self.shard_cap)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice("twoshot", 2, 2048, 1)]
        out = []
        if nbytes >= 32 << 10:
            out += [Choice("twoshot", min(progs, max(1, nbytes // 2 // block)), block, 8)
                    for block in (2048, 8192) for progs in (32, 64)]
        if 32 << 10 <= nbytes <= 8 << 20:  # small blocks: more programs busy on a small shard
            out += [Choice("twoshot", min(progs, max(1, nbytes // 2 // 1024)), 1024, 4) for progs in (32, 64)]
        if nbytes >= 4 << 20:
            out += [Choice("twoshot", 64, block, 8) for block in (4096, 16384)]
        if nbytes >= 16 << 20:  # large shards: 128 programs kept more HBM and links busy at TP4 (64 MB)
            out += [Choice("twoshot", 128, block, 8) for block in (2048, 4096)]
        return out

    @staticmethod
    def rounds_for(c: Choice, n: int, world: int, direct: bool) -> int:
        """Rounds for ``n`` elements with launch shape ``c``: ``c.rounds`` if set; else
        ``TWOSHOT_ROUNDS`` when program 0 has enough blocks and there is a copy-out to hide (not when
        peers write the output directly), else 1."""
        if c.rounds is not None:
            return c.rounds
        iters = cdiv(cdiv(round_up(cdiv(n, world), 16), c.block), c.programs)  # blocks of program 0
        return TWOSHOT_ROUNDS if iters >= TWOSHOT_ROUNDS * TWOSHOT_ROUND_MIN_ITERS and not direct else 1

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        if c.rounds is not None and c.rounds > TWOSHOT_ROUNDS:
            raise InvalidInputError(f"all_reduce: the two-shot runs at most {TWOSHOT_ROUNDS} rounds, got {c.rounds}")
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n = x.numel()
        out_heap, out_reg = dest.heap_off >= 0, dest.row != 0
        self.launcher(
            x, out, n, round_up(cdiv(n, world), 16), bases, rank, timeout, diag, ch.flags_off, ch.epochs_off,
            ch.buffer_off, ch.buffer_off + world * self.shard_cap, c.programs, max(dest.heap_off, 0), dest.row, sig,
            WORLD=world, BLOCK=c.block, OUT_HEAP=out_heap, OUT_REG=out_reg, NDIV=pow2_divisor(n),
            ROUNDS=self.rounds_for(c, n, world, out_heap or out_reg), num_warps=c.num_warps)
