"""All-reduce: the host side and its registry of algorithms (one kernel and launcher per module).

``AllReduce`` is created once per (communicator, stream) at set-up; calling it validates (host-only
checks), selects an algorithm by the table, and launches one kernel.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch
import torch.distributed as dist

from ...channels import Communicator
from ...errors import InvalidInputError
from ...units import NO_LIMIT
from ..base import NO_PEER_OUTPUT, CollectiveBase, Plans
from ..selection import Choice, SelectionTable
from ..validation import DTYPE_NAMES, check_reduce_args
from .algorithm import AllReduceAlgorithm
from .defaults import default_rows
from .lamport import LamportOneShot
from .lamport_twoshot import LamportTwoShot
from .ll import LL
from .ll_twoshot import LLTwoShot
from .oneshot import OneShot
from .twoshot import TwoShot

__all__ = ["ALGORITHMS", "AllReduce", "AllReduceAlgorithm"]

#: The all-reduce algorithms, by name, in registry order (debug codes, ties).
ALGORITHMS = MappingProxyType({cls.name: cls for cls in (LL, LLTwoShot, OneShot, TwoShot, LamportOneShot,
                                                         LamportTwoShot)})


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

    Workspace per rank (``workspace_bytes``; each algorithm's docstring): LL 4 x W x its largest
    message, LL two-shot 8 x, one-shot 2 x, two-shot 2 x theirs, Lamport
    one-shot 2 x W x, Lamport two-shot 4 x. Construction
    and ``close`` are collective; every rank must create its collectives in the same order with the
    same arguments. One instance per stream: two launches from one instance on two streams at once
    would share signal slots.
    """

    op = "allreduce"
    ALGORITHMS = ALGORITHMS
    default_rows = staticmethod(default_rows)

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 algos: tuple[str, ...] | dict[str, int] | None = None, fallback_group: dist.ProcessGroup | None = None,
                 name: str = "allreduce") -> None:
        super().__init__(comm, table=table, fallback_group=fallback_group, name=name)
        self.max_bytes = max_bytes if max_bytes is not None else \
            comm.heap.nbytes // 4 if comm.backend == "cuda" else 1 << 20
        self._check_names(algos)
        self._setup(self._capacities(self.max_bytes, algos))
        self._plans = Plans()

    def select(self, nbytes: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """The algorithm for an input of ``nbytes`` (the same on every rank), or ``"fallback"``."""
        if nbytes > self.max_bytes:
            return "fallback"
        return self._plan(dtype, nbytes)[0]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum",
                 algo: str | None = None, programs: int | None = None) -> torch.Tensor:
        """Return the sum of ``x`` over all ranks, in ``out`` if given (``out=x``: in place).

        ``algo`` forces an algorithm set up here; ``programs`` caps the active programs (every rank
        must pass the same), e.g. to leave SMs to a kernel running alongside (``GemmAllReduce``'s
        chunked path)."""
        comm = self.comm
        check_reduce_args(x, out, op, comm.device, self.max_bytes if self.fallback_group is None else NO_LIMIT,
                          "all_reduce")
        nbytes = x.numel() * x.element_size()
        if algo is not None and algo not in self._algos:
            raise InvalidInputError(f"all_reduce: algorithm {algo!r} is not set up here (have {self.algorithms})")
        if algo is not None and nbytes > self._algos[algo].capacity:
            raise InvalidInputError(f"all_reduce: {nbytes} bytes exceed {algo}'s capacity {self._algos[algo].capacity}")
        if programs is not None and (not isinstance(programs, int) or programs < 1):
            raise InvalidInputError(f"all_reduce: programs must be a positive int, got {programs!r}")
        self.check()
        if out is None:
            out = torch.empty_like(x)
        if x.numel() == 0:
            self._nothing_to_move(x.dtype)
            return out
        if nbytes > self.max_bytes:
            return self._fallback(x, out, nbytes)
        if algo is None:
            algo, c, sig = self._plan(x.dtype, nbytes)
        else:
            c, sig = self._choice(algo, DTYPE_NAMES[x.dtype], nbytes), self._signature(x.dtype, x.numel(), algo)
        if programs is not None and programs < c.programs:
            c = replace(c, programs=programs)
        a = self._algos[algo]
        dest = self._peer_output(out) if a.writes_peer_outputs else NO_PEER_OUTPUT
        if comm.debug:
            self._debug_check(x.dtype, x.numel(), algo, (*dest.signature(comm), c.programs))
        a.launch(x, out, c, dest, sig)
        return out

    def _plan(self, dtype: torch.dtype, nbytes: int) -> tuple[str, Choice, int]:
        """The algorithm (the table's, or the first set up here that serves ``nbytes`` where the table
        names one that does not), its launch shape and the call's signature, kept per (dtype, bytes)
        while ``self.table`` is the same table: the launch path looks them up once."""
        plans = self._plans
        if plans.table is not self.table:
            plans.clear()
            plans.table = self.table
        hit = plans.get((dtype, nbytes))
        if hit is not None:
            return hit
        name = DTYPE_NAMES[dtype]
        algo = self.table.lookup(self.op, self.world, name, nbytes, self._defaults).algo
        if algo not in self._algos or nbytes > self._algos[algo].capacity:  # a table/algos mismatch
            algo = self._first_serving(nbytes)
        hit = (algo, self._choice(algo, name, nbytes), self._signature(dtype, nbytes // dtype.itemsize, algo))
        plans.keep((dtype, nbytes), hit)
        return hit

    def _fallback(self, x: torch.Tensor, out: torch.Tensor, nbytes: int) -> torch.Tensor:
        self._debug_check(x.dtype, x.numel(), "fallback")
        self._note_fallback(nbytes, self.max_bytes)
        if out.data_ptr() != x.data_ptr():
            out.copy_(x)
        dist.all_reduce(out, group=self.fallback_group)
        return out
