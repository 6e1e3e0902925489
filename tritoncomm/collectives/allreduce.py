"""All-reduce: host side. Owns one channel per algorithm and picks the algorithm by table.

``AllReduce`` is created once per (communicator, stream) at set-up; calling it only validates
(host-only checks), reads the diagnostic record (host memory, no sync) and launches one kernel.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..errors import InvalidInputError
from ..kernels import pow2_divisor
from .allreduce_ll import ll_allreduce_kernel
from .allreduce_ll_twoshot import ll_twoshot_allreduce_kernel
from .allreduce_oneshot import oneshot_allreduce_kernel
from .allreduce_pipelined import pipelined_allreduce_kernel
from .allreduce_twoshot import twoshot_allreduce_kernel
from .common import CollectiveBase, round_up
from .tuning import Choice, SelectionTable
from .validation import DTYPE_NAMES, check_reduce_args

__all__ = ["ALGORITHMS", "LL_MAX_BYTES", "LL_TWOSHOT_MAX_BYTES", "AllReduce"]

ALGORITHMS = ("ll", "ll_twoshot", "oneshot", "twoshot", "pipelined")
#: LL packets double the bytes on the wire; past this size LL never pays.
LL_MAX_BYTES = 1 << 20
#: The LL two-shot moves half the LL one-shot's bytes at TP4 (a quarter at TP8), so it serves up to
#: this size (its buffers: 8 x its largest message).
LL_TWOSHOT_MAX_BYTES = 4 << 20
#: The pipelined two-shot keeps one flag row per block; blocks are at least this many elements.
PIPE_MIN_BLOCK = 1024
#: The two-shot copies round c-1 out while round c's pushes drain (``twoshot_allreduce_kernel``);
#: it runs this many rounds when program 0 has at least ``TWOSHOT_ROUND_MIN_ITERS`` blocks per
#: round, else one. Measured on 4xH200 (2026-11-21, benchmarks/experiments/twoshot_rounds.py):
#: 4 rounds save 2-9% from 16 blocks per program (64-128 MB with the shipped shapes) and cost 14-18
#: µs (up to 70%) at 4-16 MB, where the extra barriers outweigh the hidden copy.
TWOSHOT_ROUNDS = 4
TWOSHOT_ROUND_MIN_ITERS = 4


class AllReduce(CollectiveBase):
    """Sum all-reduce over a communicator's ranks.

    Args:
        comm: the communicator.
        max_bytes: the largest input served by tritoncomm kernels (default: a quarter of the heap
            on GPUs, 1 MiB in the CPU world).
        table: algorithm/launch-shape table (default: the measured one for this device, else rules
            of thumb).
        algos: the algorithms to set up, each for every size up to ``max_bytes``, or a mapping from
            algorithm to the largest size it must serve (default: those the table uses up to
            ``max_bytes``, each sized for the largest message it serves).
        fallback_group: a torch.distributed group that serves inputs larger than ``max_bytes``
            (for example the NCCL group); without it such inputs raise ``InvalidInputError``.
        name: prefix of the heap allocations.

    Workspace per rank (``workspace_bytes``): LL 4 x world x its largest message, LL two-shot 8 x
    its largest message, one-shot 2 x its largest message, two-shot and pipelined two-shot 2 x
    their largest message each. Construction and ``close`` are collective; every rank must create
    its collectives in the same order with the same arguments. One instance per stream: two
    launches from one instance on two streams at once would share signal slots.
    """

    op = "allreduce"

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 algos: tuple[str, ...] | dict[str, int] | None = None, fallback_group: dist.ProcessGroup | None = None,
                 name: str = "allreduce") -> None:
        super().__init__(comm, table=table, fallback_group=fallback_group, name=name)
        if max_bytes is None:
            max_bytes = comm.heap.nbytes // 4 if comm.backend == "cuda" else 1 << 20
        self.max_bytes = max_bytes
        if algos is not None and any(a not in ALGORITHMS for a in algos):
            raise InvalidInputError(f"unknown all-reduce algorithm in {algos}; known: {ALGORITHMS}")
        caps = self._capacities(max_bytes, algos)
        w = self.world
        limits = {"ll": LL_MAX_BYTES, "ll_twoshot": LL_TWOSHOT_MAX_BYTES}
        self.capacity = {a: min(c, limits.get(a, c)) for a, c in caps.items()}
        if "ll" in caps:
            self._ll_slot_words = round_up((self.capacity["ll"] + 3) // 4, 2)  # even: 16-byte aligned slots
            grid = self._grid_for("ll")
            self._add_channel("ll", programs=grid, barrier_slots=0, buffer_bytes=2 * w * self._ll_slot_words * 8)
        if "ll_twoshot" in caps:
            # words per (parity, source) slot: a rank's shard of the largest message, 16-word multiple
            self._ll2_slot_words = round_up(-(-((self.capacity["ll_twoshot"] + 3) // 4) // w), 16)
            grid = self._grid_for("ll_twoshot")
            half = 2 * w * self._ll2_slot_words * 8  # rs or ag: [parity][source][slot_words] packets
            self._add_channel("ll_twoshot", programs=grid, barrier_slots=0, buffer_bytes=2 * half + 2 * w * 8)
            off = self._channels["ll_twoshot"].buffer_off
            self._ll2_offs = (off, off + half, off + 2 * half)  # rs, ag, tokens
        if "oneshot" in caps:
            self._stage_bytes = round_up(self.capacity["oneshot"], 256)
            grid = self._grid_for("oneshot")
            self._add_channel("oneshot", programs=grid, barrier_slots=grid, buffer_bytes=2 * self._stage_bytes)
        if "twoshot" in caps:
            self._shard_cap = round_up(-(-self.capacity["twoshot"] // w) + 128, 256)  # bytes per rank slot
            grid = self._grid_for("twoshot")
            self._add_channel("twoshot", programs=grid, barrier_slots=2 * TWOSHOT_ROUNDS * grid,
                              buffer_bytes=2 * w * self._shard_cap)
        self._rounds_override: int | None = None  # experiments only (benchmarks/experiments)
        if "pipelined" in caps:
            self._pipe_shard_cap = round_up(-(-self.capacity["pipelined"] // w) + 128, 256)
            self._pipe_rows = -(-self._pipe_shard_cap // (2 * PIPE_MIN_BLOCK))  # blocks per shard, at most
            grid = self._grid_for("pipelined")
            self._add_channel("pipelined", programs=grid, barrier_slots=2 * self._pipe_rows,
                              buffer_bytes=2 * w * self._pipe_shard_cap)
        comm.bootstrap.barrier()

    def select(self, nbytes: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """The algorithm for an input of ``nbytes`` (the same on every rank), or ``"fallback"``."""
        if nbytes > self.max_bytes:
            return "fallback"
        return self.table.lookup(self.op, self.world, DTYPE_NAMES[dtype], nbytes).algo

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum",
                 algo: str | None = None, programs: int | None = None) -> torch.Tensor:
        """Return the sum of ``x`` over all ranks, in ``out`` if given (``out=x``: in place).

        ``algo`` forces an algorithm set up here; ``programs`` caps the active programs (every rank
        must pass the same), e.g. to leave SMs to a kernel running alongside (``GemmAllReduce``'s
        chunked path)."""
        comm = self.comm
        limit = self.max_bytes if self.fallback_group is None else 1 << 62
        check_reduce_args(x, out, op, comm.device, limit, "all_reduce")
        nbytes = x.numel() * x.element_size()
        if algo is not None and algo not in self._channels:
            raise InvalidInputError(f"all_reduce: algorithm {algo!r} is not set up here (have {self.algorithms})")
        if algo is not None and nbytes > self.capacity[algo]:
            raise InvalidInputError(f"all_reduce: {nbytes} bytes exceed {algo}'s capacity {self.capacity[algo]}")
        if programs is not None and (not isinstance(programs, int) or programs < 1):
            raise InvalidInputError(f"all_reduce: programs must be a positive int, got {programs!r}")
        comm.check()
        if out is None:
            out = torch.empty_like(x)
        if x.numel() == 0:
            return out
        if nbytes > self.max_bytes:
            self._debug_check(x.dtype, x.numel(), "fallback")
            self._note_fallback(nbytes, self.max_bytes)
            if out.data_ptr() != x.data_ptr():
                out.copy_(x)
            dist.all_reduce(out, group=self.fallback_group)
            return out
        dtype = DTYPE_NAMES[x.dtype]
        if algo is None:
            algo = self.table.lookup(self.op, self.world, dtype, nbytes).algo
            if algo not in self._channels or nbytes > self.capacity[algo]:  # a table/algos mismatch
                algo = next((a for a in ALGORITHMS if a in self._channels and nbytes <= self.capacity[a]), None)
                if algo is None:
                    raise InvalidInputError(f"all_reduce: no algorithm of this instance serves {nbytes} bytes "
                                            f"(capacities {self.capacity})")
        c = self._choice(algo, dtype, nbytes)
        if programs is not None and programs < c.programs:
            c = Choice(c.algo, programs, c.block, c.num_warps)
        out_heap, out_off, out_tab = False, 0, 0
        if c.algo == "twoshot":  # write peers' outputs directly: a registered output (Communicator.register,
            out_tab = comm.peer_row(out) or 0  # graph_capture) or a symmetric one (Communicator.empty)
            oo = comm.heap_offset(out) if not out_tab else None
            if oo is not None and oo % 16 == 0:
                out_heap, out_off = True, oo
            # The input is pushed even when it is symmetric: reading peers' inputs instead measured
            # slower (allreduce_twoshot's docstring).
        # debug mode also compares the zero-copy choice, the symmetric output's offset and the registered slot
        self._debug_check(x.dtype, x.numel(), c.algo,
                          (out_heap, out_off, comm.peer_slot(out_tab) if out_tab else -1, c.programs))
        ch = self._channels[c.algo]
        bases, rank, world, timeout, diag = comm.kernel_args()
        grid = (self._grids[c.algo],)
        if c.algo == "ll":
            ll_allreduce_kernel[grid](
                x, out, x.numel(), (nbytes + 3) // 4, bases, rank, timeout, diag, ch.epochs_off, ch.buffer_off,
                self._ll_slot_words, c.programs, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(x.numel()),
                WDIV=pow2_divisor((nbytes + 3) // 4), num_warps=c.num_warps)
        elif c.algo == "ll_twoshot":
            nwords = (nbytes + 3) // 4
            shard = round_up(-(-nwords // world), 16)  # words; 16-word multiples keep 16-byte vectors
            ll_twoshot_allreduce_kernel[grid](
                x, out, x.numel(), nwords, shard, bases, rank, timeout, diag, ch.epochs_off, *self._ll2_offs,
                self._ll2_slot_words, c.programs, WORLD=world,
                BLOCK=c.block, NDIV=pow2_divisor(x.numel()), WDIV=pow2_divisor(nwords), num_warps=c.num_warps)
        elif c.algo == "oneshot":
            oneshot_allreduce_kernel[grid](
                x, out, x.numel(), bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off,
                self._stage_bytes, c.programs, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(x.numel()),
                num_warps=c.num_warps)
        elif c.algo == "pipelined":
            shard = round_up(-(-x.numel() // world), 16)
            pipelined_allreduce_kernel[grid](
                x, out, x.numel(), shard, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off,
                ch.buffer_off + world * self._pipe_shard_cap, self._pipe_rows, c.programs, WORLD=world,
                BLOCK=max(c.block, PIPE_MIN_BLOCK), NDIV=pow2_divisor(x.numel()), num_warps=c.num_warps)
        else:
            shard = round_up(-(-x.numel() // world), 16)
            nblocks = -(-shard // c.block)
            iters = -(-nblocks // c.programs)  # blocks of program 0
            # rounds hide the copy-out; with peers writing the output directly there is none to hide
            many = iters >= TWOSHOT_ROUNDS * TWOSHOT_ROUND_MIN_ITERS and not out_heap and not out_tab
            rounds = TWOSHOT_ROUNDS if many else 1
            rounds = self._rounds_override or rounds
            twoshot_allreduce_kernel[grid](
                x, out, x.numel(), shard, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off,
                ch.buffer_off + world * self._shard_cap, c.programs, out_off, out_tab, WORLD=world,
                BLOCK=c.block, OUT_HEAP=out_heap, OUT_REG=bool(out_tab), NDIV=pow2_divisor(x.numel()), ROUNDS=rounds,
                num_warps=c.num_warps)
        return out
