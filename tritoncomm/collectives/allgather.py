"""All-gather and reduce-scatter into tensors: host side (kernels in ``allgather_push`` and
``reducescatter_push``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..errors import InvalidInputError
from ..kernels import pow2_divisor
from .allgather_push import allgather_kernel
from .common import CollectiveBase, round_up
from .reducescatter_push import reducescatter_kernel
from .tuning import SelectionTable
from .validation import DTYPE_NAMES, check_input, check_op, check_out

__all__ = ["AllGather", "ReduceScatter"]


class _PushCollective(CollectiveBase):
    """Shared set-up: one ``push`` channel whose buffer holds two halves of ``world`` slots."""

    def __init__(self, comm: Communicator, max_bytes: int | None, table: SelectionTable | None,
                 fallback_group: dist.ProcessGroup | None, name: str) -> None:
        super().__init__(comm, table=table, fallback_group=fallback_group, name=name)
        if max_bytes is None:
            max_bytes = comm.heap.nbytes // 8 if comm.backend == "cuda" else 1 << 20
        self.max_bytes = max_bytes
        self._half = self.world * round_up(-(-max_bytes // self.world) + 128, 256)
        grid = self._grid_for("push")  # two barrier slots a program: the direct all-gather's entry and exit
        self._add_channel("push", programs=grid, barrier_slots=2 * grid, buffer_bytes=2 * self._half)
        comm.bootstrap.barrier()

    def _launch(self, kernel, x: torch.Tensor, out: torch.Tensor, m: int, full_bytes: int, **extra: int) -> None:
        """``extra``: the kernel's own arguments (the all-gather's ``out_tab`` and ``DIRECT``)."""
        c = self._choice("push", DTYPE_NAMES[x.dtype], full_bytes)
        row = extra.get("out_tab", 0)
        self._debug_check(x.dtype, m, "push", (self.comm.peer_slot(row),) if row else ())
        ch = self._channels["push"]
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        kernel[(self._grids["push"],)](
            x, out, m, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off, ch.buffer_off, self._half,
            round_up(m, 16), c.programs, WORLD=world, BLOCK=c.block, MDIV=pow2_divisor(m), num_warps=c.num_warps,
            **extra)

    def _too_large(self, x: torch.Tensor, m: int, nbytes: int, what: str) -> bool:
        if nbytes <= self.max_bytes:
            return False
        self._debug_check(x.dtype, m, "fallback")
        if self.fallback_group is None:
            raise InvalidInputError(f"{what}: {nbytes} bytes exceed max_bytes={self.max_bytes} and no fallback "
                                    "group was given")
        self._note_fallback(nbytes, self.max_bytes)
        return True


class AllGather(_PushCollective):
    """``out = cat([x of rank 0, ..., x of rank W-1])`` along dim 0 (``all_gather_into_tensor``).

    ``max_bytes`` bounds the *output* size. Workspace: about 2 x ``max_bytes`` per rank.
    """

    op = "allgather"
    #: Registered outputs of at least this many bytes take the direct form by default, by world
    #: size (others: ``DIRECT_MIN_BYTES``). Measured on 4x H200 (session 11 run 2, 2026-11-22, CUDA
    #: graphs): the direct form costs 0.5-0.8 µs (TP4) and 0.9-1.6 µs (TP2) up to 512 KB; it is faster from
    #: 1 MB at TP4 (7.9 vs 8.3 µs; 128 MB 301.3 vs 418.2) and from 4 MB at TP2 (11.7 vs 11.9 µs;
    #: 2 MB 8.7 vs 8.3; 128 MB 209.7 vs 288.0).
    DIRECT_FROM: Mapping[int, int] = MappingProxyType({2: 4 << 20, 4: 1 << 20})
    DIRECT_MIN_BYTES = 4 << 20

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 fallback_group: dist.ProcessGroup | None = None, name: str = "allgather") -> None:
        super().__init__(comm, max_bytes, table, fallback_group, name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, direct: bool | None = None) -> torch.Tensor:
        """``direct``: store straight into every rank's registered output (``Communicator.register``,
        ``graph_capture``) after an entry barrier, instead of pushing into the heap and copying out.
        None (the default) takes it for registered outputs from ``DIRECT_FROM``'s size; True
        needs a registered output; every rank must pass the same."""
        check_input(x, self.comm.device, "all_gather")
        w = self.world
        if out is not None:
            check_out(out, x, w * x.numel(), "all_gather", may_alias=False)
        self.comm.check()
        if out is None:
            out = x.new_empty((w * x.shape[0], *x.shape[1:]) if x.dim() else (w,))
        if x.numel() == 0:
            return out
        if self._too_large(x, x.numel(), out.numel() * out.element_size(), "all_gather"):
            dist.all_gather_into_tensor(out, x, group=self.fallback_group)
            return out
        nbytes = out.numel() * out.element_size()
        row = 0
        if direct or (direct is None and nbytes >= self.DIRECT_FROM.get(self.world, self.DIRECT_MIN_BYTES)):
            row = self.comm.peer_row(out) or 0
            if direct and not row:
                raise InvalidInputError("all_gather: direct=True needs an output registered with Communicator.register "
                                        "(or met inside graph_capture)")
        self._launch(allgather_kernel, x, out, x.numel(), nbytes, out_tab=row, DIRECT=bool(row))
        return out


class ReduceScatter(_PushCollective):
    """``out = (sum over ranks of x)[rank * m : (rank + 1) * m]`` with ``m = x.numel() / world``
    (``reduce_scatter_tensor``). ``max_bytes`` bounds the *input* size. Sum in fp32, ranks in order.
    Workspace: about 2 x ``max_bytes`` per rank."""

    op = "reducescatter"

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 fallback_group: dist.ProcessGroup | None = None, name: str = "reducescatter") -> None:
        super().__init__(comm, max_bytes, table, fallback_group, name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum") -> torch.Tensor:
        check_input(x, self.comm.device, "reduce_scatter")
        check_op(op, "reduce_scatter")
        w = self.world
        if x.numel() % w:
            raise InvalidInputError(f"reduce_scatter: {x.numel()} elements do not split into {w} equal shards")
        m = x.numel() // w
        if out is not None:
            check_out(out, x, m, "reduce_scatter", may_alias=False)
        self.comm.check()
        if out is None:
            out = x.new_empty((x.shape[0] // w, *x.shape[1:]) if x.dim() and x.shape[0] % w == 0 else (m,))
        if m == 0:
            return out
        if self._too_large(x, m, x.numel() * x.element_size(), "reduce_scatter"):
            dist.reduce_scatter_tensor(out, x, group=self.fallback_group)
            return out
        self._launch(reducescatter_kernel, x, out, m, x.numel() * x.element_size())
        return out
