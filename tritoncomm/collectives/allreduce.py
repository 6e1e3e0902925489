"""All-reduce: host side. Owns the channels the kernels synchronise through and picks an algorithm.

``AllReduce`` is created once per (communicator, stream) at set-up; calling it only validates
(host-only checks), reads the diagnostic record (host memory, no sync) and launches one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..channels import Channel, Communicator
from ..errors import InvalidInputError
from .allreduce_ll import ll_allreduce_kernel
from .allreduce_oneshot import oneshot_allreduce_kernel
from .validation import check_reduce_args

__all__ = ["ALGORITHMS", "AllReduce", "AllReduceLaunch"]

ALGORITHMS = ("ll", "oneshot")


@dataclass(frozen=True)
class AllReduceLaunch:
    """Launch shape of one algorithm: programs in the (fixed) grid, block size, warps."""

    programs: int
    block: int
    num_warps: int


def _default_launches(backend: str) -> dict[str, AllReduceLaunch]:
    if backend == "cuda":
        # ll: BLOCK words per program step (8 packets of 8 B per thread at 4 warps);
        # oneshot: BLOCK elements per step.
        return {"ll": AllReduceLaunch(programs=16, block=1024, num_warps=4),
                "oneshot": AllReduceLaunch(programs=32, block=4096, num_warps=8)}
    # The interpreter runs programs one after another; few programs, large blocks.
    return {"ll": AllReduceLaunch(programs=2, block=1024, num_warps=1),
            "oneshot": AllReduceLaunch(programs=2, block=2048, num_warps=1)}


class AllReduce:
    """Sum all-reduce over a communicator's ranks.

    Args:
        comm: the communicator.
        max_bytes: the largest input served (heap space: 2 x ``max_bytes`` for one-shot staging).
        ll_max_bytes: inputs up to this size use the LL algorithm (heap space:
            2 x world x 2 x ``ll_max_bytes`` for packets). ``0`` disables LL.
        launches: per-algorithm launch shapes (default: per backend).
        name: prefix of the heap allocations.

    Construction and ``close`` are collective; every rank must create its all-reduces in the
    same order with the same arguments. One instance per stream: two launches from one instance
    on two streams at once would share signal slots.
    """

    def __init__(self, comm: Communicator, *, max_bytes: int | None = None, ll_max_bytes: int | None = None,
                 launches: dict[str, AllReduceLaunch] | None = None, name: str = "allreduce") -> None:
        self.comm = comm
        cuda = comm.backend == "cuda"
        if max_bytes is None:
            max_bytes = min(64 << 20, comm.heap.nbytes // 4) if cuda else 1 << 20
        if ll_max_bytes is None:
            ll_max_bytes = min(256 << 10, max_bytes) if cuda else min(64 << 10, max_bytes)
        self.max_bytes = max_bytes
        self.ll_max_bytes = min(ll_max_bytes, max_bytes)
        self.launches = {**_default_launches(comm.backend), **(launches or {})}
        w = comm.world
        self._closed = False
        ll = self.launches["ll"]
        os_ = self.launches["oneshot"]
        self._ll_slot_words = -(-((self.ll_max_bytes + 3) // 4) // 2) * 2  # even: 16-byte aligned slots
        self.ll = Channel(comm, f"{name}.ll", programs=ll.programs,
                          buffer_bytes=2 * w * self._ll_slot_words * 8) if self.ll_max_bytes else None
        self._stage_bytes = -(-max_bytes // 256) * 256
        try:
            self.oneshot = Channel(comm, f"{name}.oneshot", programs=os_.programs, barrier_slots=os_.programs,
                                   buffer_bytes=2 * self._stage_bytes)
        except BaseException:
            if self.ll is not None:
                self.ll.close()
            raise

    @property
    def workspace_bytes(self) -> int:
        """Heap bytes this all-reduce holds on each rank."""
        return (self.ll.heap_bytes if self.ll else 0) + self.oneshot.heap_bytes

    def select(self, nbytes: int) -> str:
        """The algorithm for an input of ``nbytes`` (the same on every rank for the same size)."""
        return "ll" if nbytes <= self.ll_max_bytes else "oneshot"

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum",
                 algo: str | None = None) -> torch.Tensor:
        """Return the sum of ``x`` over all ranks, in ``out`` if given (``out=x``: in place)."""
        comm = self.comm
        check_reduce_args(x, out, op, comm.device, self.max_bytes, "all_reduce")
        if algo is not None and (algo not in ALGORITHMS or (algo == "ll" and self.ll is None)):
            raise InvalidInputError(f"all_reduce: algorithm {algo!r} is not available here")
        nbytes = x.numel() * x.element_size()
        algo = algo or self.select(nbytes)
        if algo == "ll" and nbytes > self.ll_max_bytes:
            raise InvalidInputError(f"all_reduce: {nbytes} bytes exceed ll_max_bytes={self.ll_max_bytes}")
        comm.check()
        if out is None:
            out = torch.empty_like(x)
        if x.numel() == 0:
            return out
        bases, rank, world, timeout, diag = comm.kernel_args()
        if algo == "ll":
            lc, ch = self.launches["ll"], self.ll
            ll_allreduce_kernel[(lc.programs,)](
                x, out, x.numel(), (nbytes + 3) // 4, bases, rank, timeout, diag, ch.epochs_off, ch.buffer_off,
                self._ll_slot_words, WORLD=world, BLOCK=lc.block, num_warps=lc.num_warps)
        else:
            lc, ch = self.launches["oneshot"], self.oneshot
            oneshot_allreduce_kernel[(lc.programs,)](
                x, out, x.numel(), bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off,
                self._stage_bytes, WORLD=world, BLOCK=lc.block, num_warps=lc.num_warps)
        return out

    def close(self) -> None:
        """Collective: return the workspace to the heap."""
        if self._closed:
            return
        self._closed = True
        if self.ll is not None:
            self.ll.close()
        self.oneshot.close()
