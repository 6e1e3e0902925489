"""All-gather and all-to-all into a tensor, and the push layout they share with reduce-scatter.

Staged form (``AllGatherPush``): every rank pushes its shard into slot [my rank] of every peer's
buffer, meets them at a barrier, then copies the other shards out.

Direct form (``AllGatherDirect``, kernel flag ``DIRECT``), for a registered output
(``Communicator.register``/``graph_capture``): ``out_tab`` is the address of the output's table
row; after an entry barrier every rank stores its shard straight into every rank's output, and a
second barrier ends the launch (no copy-out). The
entry barrier is what makes it safe: a peer may store into this rank's output only once this rank
has started the launch, i.e. once its stream is past every earlier use of that memory.

All-to-all (``ALLTOALL``, ``AllToAllPush``/``AllToAllDirect``): the same two forms, but each rank
sends shard ``s`` of its input (not the whole input) to rank ``s``, into slot [my rank] there.

Shards of different sizes (``VAR``, the staged all-gather and the reduce-scatter, ``all_gatherv`` /
``reduce_scatterv``): rank ``r``'s shard has ``rows[r]`` rows of ``row`` elements, every rank passing
the same ``rows``, packed 16 bits a rank (``packed_rows``); the slots are as wide as the largest.

Buffers alternate by epoch parity (halves of the channel buffer, each sized for the largest
output): a rank cannot finish launch k+1 before every peer has started it, so the half it writes
for launch k+1 is never the one a peer still reads for launch k. Program ``pid`` handles blocks
``pid, pid + active, ...`` of every shard on every rank (barriers between matching programs).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...kernels import assume_multiple, barrier, epoch_commit, heap_ptr, pow2_divisor, program_epoch
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import Algorithm, PeerOutput, Workspace
from ..selection import Choice

__all__ = ["MAX_ROWS", "AllGatherDirect", "AllGatherPush", "AllToAllDirect", "AllToAllPush", "PushAlgorithm",
           "allgather_kernel", "packed_rows", "shard"]

#: Most rows a rank's shard may have with ``VAR`` (16 bits a rank in ``packed_rows``).
MAX_ROWS = (1 << 16) - 1


def packed_rows(rows: tuple[int, ...]) -> tuple[int, int]:
    """``rows`` (one count per rank, at most 8 ranks, each at most ``MAX_ROWS``) as two int64 kernel
    arguments: rank ``r``'s count in bits ``16 * (r % 4)`` and up of word ``r // 4``."""
    words = [0, 0]
    for r, n in enumerate(rows):
        words[r // 4] |= n << (16 * (r % 4))
    return tuple(w - (1 << 64) if w >= 1 << 63 else w for w in words)  # type: ignore[return-value]


@triton.jit
def shard(s, m, rows_lo, rows_hi, row, WORLD: tl.constexpr, VAR: tl.constexpr):
    """Element offset and count of rank ``s``'s shard: ``s * m`` and ``m``, or with ``VAR`` from the
    packed rows (``packed_rows``) of ``row`` elements each."""
    if VAR:
        off = tl.zeros([], dtype=tl.int64)
        n = tl.zeros([], dtype=tl.int64)
        for r in tl.static_range(WORLD):
            if r < 4:
                nr = (rows_lo.to(tl.int64) >> (16 * r)) & 0xFFFF
            else:
                nr = (rows_hi.to(tl.int64) >> (16 * (r - 4))) & 0xFFFF
            off += tl.where(r < s, nr, 0)
            n += tl.where(r == s, nr, 0)
        return off * row, n * row
    else:
        return s * m, m


@triton.jit
def _own_shard(x_ptr, out_ptr, m, own_off, iters, pid, active, rank, BLOCK: tl.constexpr, ALLTOALL: tl.constexpr):
    """Store this program's blocks of this rank's shard of ``x`` at ``out[own_off:]``."""
    for i in range(0, iters):
        j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
        mask = j < m
        if ALLTOALL:
            v = tl.load(x_ptr + rank * m + j, mask=mask)
        else:
            v = tl.load(x_ptr + j, mask=mask)
        tl.store(out_ptr + own_off + j, v, mask=mask)


@triton.jit
def _push_shard(x_ptr, out_ptr, m, own_off, iters, pid, active, rank, table, dst_off, dst_elem,
                WORLD: tl.constexpr, BLOCK: tl.constexpr, ALLTOALL: tl.constexpr, OWN: tl.constexpr):
    """Store this program's blocks of ``x`` (with ``ALLTOALL``: of shard ``s`` of ``x``, ``m``
    elements each), for every peer ``s``, at byte ``dst_off`` + element ``dst_elem`` of the memory
    ``table[s]`` points to (a heap base or a registered output), and with ``OWN`` at
    ``out[own_off:]`` (shard ``rank``) in the same pass."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    for i in range(0, iters):
        j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
        mask = j < m
        if not ALLTOALL:
            v = tl.load(x_ptr + j, mask=mask)
        for s in tl.static_range(WORLD):
            if s != rank:
                if ALLTOALL:
                    v = tl.load(x_ptr + s * m + j, mask=mask)
                tl.store(heap_ptr(table, s, dst_off, DTYPE) + dst_elem + j, v, mask=mask)
        if OWN:
            if ALLTOALL:
                v = tl.load(x_ptr + rank * m + j, mask=mask)
            tl.store(out_ptr + own_off + j, v, mask=mask)


@triton.jit(do_not_specialize=["rank", "rows_lo", "rows_hi", "sig"])  # one kernel for every rank and size mix
def allgather_kernel(x_ptr, out_ptr, m, bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off, half_bytes,
                     stride, active, out_tab=0, rows_lo=0, rows_hi=0, row=1, sig=None, WORLD: tl.constexpr = 2,
                     BLOCK: tl.constexpr = 1024, MDIV: tl.constexpr = 1, DIRECT: tl.constexpr = False,
                     ALLTOALL: tl.constexpr = False, VAR: tl.constexpr = False):
    """``out[r*m:(r+1)*m] = x`` of rank ``r`` (with ``ALLTOALL``: ``x[rank*m:(rank+1)*m]`` of rank
    ``r``; with ``VAR``: rank ``r``'s shard at its offset, ``m`` this rank's count, ``stride`` the
    largest), for every rank; ``m`` (and with ``VAR`` ``row``) is a multiple of ``MDIV``. Barrier
    slots ``pid`` and (``DIRECT``) ``pid + grid``. ``sig``: the call's signature, compared at the first
    barrier; where a rank's differs nothing more is pushed or written (the staged form copies its own
    shard into ``out`` after that barrier)."""
    pid = tl.program_id(0)
    m = assume_multiple(m, MDIV)
    if VAR:
        row = assume_multiple(row, MDIV)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        span = m
        if VAR:
            span = stride
        iters = tl.cdiv(tl.cdiv(span, BLOCK) - pid, active)
        own_off, _ = shard(rank, m, rows_lo, rows_hi, row, WORLD, VAR)
        if DIRECT:
            if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):  # every rank has entered
                iters = iters * 0  # a rank called another collective: store nothing
            row_tab = address_ptr(out_tab, tl.int64)
            _push_shard(x_ptr, out_ptr, m, own_off, iters, pid, active, rank, row_tab,
                        0, rank * m, WORLD, BLOCK, ALLTOALL, True)
            barrier(bases, rank, WORLD, flags_off, pid + tl.num_programs(0), e, timeout, diag)
        else:
            base = buf_off + (e & 1).to(tl.int64) * half_bytes
            _push_shard(x_ptr, out_ptr, m, own_off, iters, pid, active, rank, bases, base + rank * stride * ESIZE,
                        0, WORLD, BLOCK, ALLTOALL, False)
            if not barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag, sig):
                iters = iters * 0  # a rank called another collective: write nothing
            _own_shard(x_ptr, out_ptr, m, own_off, iters, pid, active, rank, BLOCK, ALLTOALL)
            for i in range(0, iters):
                j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
                for s in tl.static_range(WORLD):
                    if s != rank:
                        off, n = shard(s, m, rows_lo, rows_hi, row, WORLD, VAR)
                        v = tl.load(heap_ptr(bases, rank, base + s * stride * ESIZE, DTYPE) + j, mask=j < n)
                        tl.store(out_ptr + off + j, v, mask=j < n)
    epoch_commit(epoch_ptr, e)


class PushAlgorithm(Algorithm):
    """The push family's launcher interface and staged layout (all-gather and reduce-scatter):
    ``launch(x, out, m, c, dest)`` moves ``m`` elements per rank with launch shape ``c``. Workspace:
    two halves (parities) of W slots, each half the capacity plus padding, and a barrier slot per
    program. The capacity bounds the all-gather's output and the reduce-scatter's input."""

    shapes = MappingProxyType({"cuda": (32, 4096, 8), "cpu": (2, 2048, 1)})

    def layout(self) -> Workspace:
        self.half = self.world * round_up(cdiv(self.capacity, self.world) + 128, 256)
        return Workspace(barrier_slots=self.grid, buffer_bytes=2 * self.half)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice(cls.name, 2, 2048, 1)]
        return [Choice(cls.name, min(progs, max(1, nbytes // 2 // block)), block, 8 if block > 1024 else 4)
                for block in (1024, 4096) for progs in (8, 32, 64)]

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        """``sig`` names the call (``kernels.consistency.pack_signature``): the barriers compare it."""
        raise NotImplementedError

    def _run(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, sig: int | None, *more: int,
             var: tuple[tuple[int, ...], int] | None = None, **extra) -> None:
        """One launch; ``more``: the kernel's runtime parameters after ``active`` and before the rows,
        in order (the ``Launcher``'s fast path takes them positionally); then ``rows_lo, rows_hi,
        row`` and ``sig``. ``var``: ``(rows per rank, elements per row)`` for shards of different sizes
        (``VAR``), the same on every rank, this rank's ``m`` among them; else the rows' defaults."""
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        stride, mdiv = round_up(m, 16), pow2_divisor(m)
        if var is not None:
            rows, row = var
            more = (*more, *packed_rows(rows), row, sig)
            stride, mdiv = round_up(max(rows) * row, 16), pow2_divisor(row)
            extra["VAR"] = True
        else:
            more = (*more, 0, 0, 1, sig)
        self.launcher(x, out, m, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off, self.half,
                      stride, c.programs, *more, WORLD=world, BLOCK=c.block, MDIV=mdiv, num_warps=c.num_warps,
                      **extra)


class AllGatherPush(PushAlgorithm):
    """Staged all-gather (``allgather_kernel``): push into peers' heaps, barrier, copy out."""

    name = "push"
    kernel = allgather_kernel

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None,
               var: tuple[tuple[int, ...], int] | None = None) -> None:
        self._run(x, out, m, c, sig, 0, var=var)  # out_tab, unused, before the rows


class AllGatherDirect(PushAlgorithm):
    """Direct all-gather into a registered output (``allgather_kernel`` with ``DIRECT``): entry
    barrier, stores into every rank's output, exit barrier. No buffer; two barrier slots per
    program. Its launch shape is the staged form's at the same size."""

    name = "direct"
    kernel = allgather_kernel
    writes_peer_outputs = True

    def layout(self) -> Workspace:
        self.half = 0
        return Workspace(barrier_slots=2 * self.grid)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        return []

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        self._run(x, out, m, c, sig, dest.row, DIRECT=True)


class AllToAllPush(AllGatherPush):
    """Staged all-to-all (``allgather_kernel`` with ``ALLTOALL``): shard ``s`` pushed into rank
    ``s``'s heap, barrier, copy out. The capacity bounds the output (as the all-gather's)."""

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        self._run(x, out, m, c, sig, 0, ALLTOALL=True)


class AllToAllDirect(AllGatherDirect):
    """Direct all-to-all into a registered output (``allgather_kernel`` with ``DIRECT`` and
    ``ALLTOALL``): entry barrier, shard ``s`` stored into rank ``s``'s output, exit barrier."""

    def launch(self, x: torch.Tensor, out: torch.Tensor, m: int, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        self._run(x, out, m, c, sig, dest.row, DIRECT=True, ALLTOALL=True)
