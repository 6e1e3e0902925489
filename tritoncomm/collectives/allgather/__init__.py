"""All-gather, all-to-all and reduce-scatter into tensors: the host side and their registries
(kernels and launchers in ``push`` and ``reducescatter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch
import torch.distributed as dist

from ...channels import Communicator
from ...errors import InvalidInputError
from ...units import NO_LIMIT
from ..base import NO_PEER_OUTPUT, CollectiveBase, PeerOutput
from ..selection import Choice, SelectionTable
from ..validation import DTYPE_NAMES, check_input, check_op, check_out
from .push import MAX_ROWS, AllGatherDirect, AllGatherPush, AllToAllDirect, AllToAllPush, PushAlgorithm
from .reducescatter import ReduceScatterPush

__all__ = ["AllGather", "AllToAll", "ReduceScatter"]


class _PushCollective(CollectiveBase):
    """Shared set-up: every algorithm sized for ``max_bytes`` with the grid of the table's ``push``."""

    @classmethod
    def default_rows(cls, backend: str, world: int) -> list[tuple[int, Choice]]:
        """One row: ``push`` at every size (many programs on GPUs; few, big blocks in the CPU world,
        where the interpreter runs programs one after another)."""
        shape = Choice("push", 32, 4096, 8) if backend == "cuda" else Choice("push", 2, 2048, 1)
        return [(NO_LIMIT, shape)]

    def __init__(self, comm: Communicator, max_bytes: int | None, table: SelectionTable | None,
                 fallback_group: dist.ProcessGroup | None, name: str) -> None:
        super().__init__(comm, table=table, fallback_group=fallback_group, name=name)
        self.max_bytes = max_bytes if max_bytes is not None else \
            comm.heap.nbytes // 8 if comm.backend == "cuda" else 1 << 20
        grid = self._grid_for("push")
        self._setup(dict.fromkeys(self.ALGORITHMS, self.max_bytes), dict.fromkeys(self.ALGORITHMS, grid))

    def _launch(self, algo: str, x: torch.Tensor, out: torch.Tensor, m: int, full_bytes: int,
                dest: PeerOutput) -> None:
        """One launch of ``algo`` with the table's ``push`` shape for ``full_bytes``."""
        a: PushAlgorithm = self._algos[algo]  # type: ignore[assignment]
        c = self._choice("push", DTYPE_NAMES[x.dtype], full_bytes)
        self._debug_check(x.dtype, m, algo, (dest.signature(self.comm)[2],) if dest.row else ())
        a.launch(x, out, m, c, dest, self._signature(x.dtype, m, algo))

    def fits_rows(self, rows: Sequence[int], row: int, element_size: int) -> bool:
        """Whether shards of ``rows`` rows (one count per rank) of ``row`` elements of
        ``element_size`` bytes go through the kernels rather than the fallback: the slots are as wide
        as the largest shard, so ``world x`` its bytes must fit ``max_bytes``, and a count must fit
        its 16 bits (``MAX_ROWS``). It reads only what every rank passes alike, so callers that ask it
        first (the engines' adapters) never split the ranks."""
        most = max(rows)
        return most <= MAX_ROWS and self.world <= 8 and self.world * most * row * element_size <= self.max_bytes

    def _rows(self, sizes: Sequence[int], mine: int | None, what: str) -> tuple[int, ...] | None:
        """``sizes`` (rows per rank, the same list on every rank; ``mine``, where given, this rank's)
        checked: None where they are all equal (the equal-shard path serves them), else as a tuple."""
        rows = tuple(sizes)
        if len(rows) != self.world or any(not isinstance(n, int) or n < 0 for n in rows):
            raise InvalidInputError(f"{what}: sizes must be {self.world} counts of rows, one per rank, got {sizes!r}")
        if mine is not None and rows[self.comm.rank] != mine:
            raise InvalidInputError(f"{what}: sizes[{self.comm.rank}] = {rows[self.comm.rank]} but this rank "
                                    f"has {mine} rows")
        return None if all(n == rows[0] for n in rows) else rows

    def _var_too_large(self, x: torch.Tensor, rows: tuple[int, ...], row: int, what: str) -> bool:
        """Whether shards of ``rows`` rows of ``row`` elements go to the fallback (``fits_rows``);
        without a fallback group that is an error, raised before any rank waits."""
        if self.fits_rows(rows, row, x.element_size()):
            return False
        nbytes = self.world * max(rows) * row * x.element_size()
        self._debug_check(x.dtype, sum(rows) * row, "fallback", (rows,))
        if self.fallback_group is None:
            raise InvalidInputError(f"{what}: shards of {rows} rows need {nbytes} bytes of slots (max_bytes="
                                    f"{self.max_bytes}, at most {MAX_ROWS} rows a rank, 8 ranks) and no fallback "
                                    "group was given")
        self._note_fallback(nbytes, self.max_bytes)
        return True

    def _launch_var(self, x: torch.Tensor, out: torch.Tensor, rows: tuple[int, ...], row: int) -> None:
        """One staged launch with shards of ``rows`` rows of ``row`` elements (``VAR``)."""
        a: PushAlgorithm = self._algos["push"]  # type: ignore[assignment]
        total = sum(rows) * row
        c = self._choice("push", DTYPE_NAMES[x.dtype], total * x.element_size())
        self._debug_check(x.dtype, total, "push", (rows,))
        a.launch(x, out, rows[self.comm.rank] * row, c, NO_PEER_OUTPUT, self._signature(x.dtype, total, "push"),
                 var=(rows, row))

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
    ALGORITHMS = MappingProxyType({cls.name: cls for cls in (AllGatherPush, AllGatherDirect)})
    #: Registered outputs of at least this many bytes take the direct form by default, by world
    #: size (others: ``DIRECT_MIN_BYTES``); measured crossovers in ``docs/algorithms.md``.
    DIRECT_FROM: Mapping[int, int] = MappingProxyType({2: 4 << 20, 4: 1 << 20})
    DIRECT_MIN_BYTES = 4 << 20

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 fallback_group: dist.ProcessGroup | None = None, name: str = "allgather") -> None:
        super().__init__(comm, max_bytes, table, fallback_group, name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, direct: bool | None = None,
                 sizes: Sequence[int] | None = None) -> torch.Tensor:
        """``direct``: store straight into every rank's registered output (``Communicator.register``,
        ``graph_capture``) after an entry barrier, instead of pushing into the heap and copying out.
        None (the default) takes it for registered outputs from ``DIRECT_FROM``'s size; True
        needs a registered output; every rank must pass the same.

        ``sizes`` (``all_gatherv``): the rows (along dim 0) of every rank's ``x``, the same list on
        every rank; ``out`` then holds their sum of rows, rank ``r``'s after those of ranks before it.
        Unequal sizes take the staged form."""
        check_input(x, self.comm.device, "all_gather")
        rows = self._rows(sizes, x.shape[0] if x.dim() else -1, "all_gather") if sizes is not None else None
        if rows is not None:
            return self._gatherv(x, out, rows)
        w = self.world
        if out is not None:
            check_out(out, x, w * x.numel(), "all_gather", may_alias=False)
        self.check()
        if out is None:
            out = x.new_empty((w * x.shape[0], *x.shape[1:]) if x.dim() else (w,))
        if x.numel() == 0:
            self._nothing_to_move(x.dtype)
            return out
        nbytes = out.numel() * out.element_size()
        if self._too_large(x, x.numel(), nbytes, "all_gather"):
            dist.all_gather_into_tensor(out, x, group=self.fallback_group)
            return out
        dest = NO_PEER_OUTPUT
        if direct or (direct is None and nbytes >= self.DIRECT_FROM.get(self.world, self.DIRECT_MIN_BYTES)):
            dest = self._peer_output(out, heap=False)
            if direct and not dest.row:
                raise InvalidInputError("all_gather: direct=True needs an output registered with "
                                        "Communicator.register (or met inside graph_capture)")
        algo = "direct" if dest.row else "push"
        self._launch(algo, x, out, x.numel(), nbytes, dest)
        return out

    def _gatherv(self, x: torch.Tensor, out: torch.Tensor | None, rows: tuple[int, ...]) -> torch.Tensor:
        row = int(torch.Size(x.shape[1:]).numel())
        total = sum(rows)
        if out is not None:
            check_out(out, x, total * row, "all_gather", may_alias=False)
        self.check()
        if out is None:
            out = x.new_empty((total, *x.shape[1:]))
        if total == 0 or row == 0:
            self._nothing_to_move(x.dtype)
            return out
        if self._var_too_large(x, rows, row, "all_gather"):  # every shard padded to the largest
            most = max(rows)
            padded = x.new_zeros((most, row))
            padded[:x.shape[0]] = x.reshape(-1, row)
            gathered = x.new_empty((self.world * most, row))
            dist.all_gather_into_tensor(gathered, padded, group=self.fallback_group)
            torch.cat([gathered[r * most:r * most + n] for r, n in enumerate(rows)], out=out.view(total, row))
            return out
        self._launch_var(x, out, rows, row)
        return out


class AllToAll(_PushCollective):
    """``out[r*m:(r+1)*m] = x[rank*m:(rank+1)*m]`` of rank ``r``, for every rank ``r``, with ``m =
    x.numel() / world`` (``all_to_all_single`` with equal splits): shard ``s`` of this rank's input
    goes to rank ``s``, and shard ``r`` of the output comes from rank ``r``.

    ``max_bytes`` bounds the input (= output) size. Workspace: about 2 x ``max_bytes`` per rank.
    """

    op = "alltoall"
    ALGORITHMS = MappingProxyType({cls.name: cls for cls in (AllToAllPush, AllToAllDirect)})

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 fallback_group: dist.ProcessGroup | None = None, name: str = "alltoall") -> None:
        super().__init__(comm, max_bytes, table, fallback_group, name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, direct: bool = False) -> torch.Tensor:
        """``direct``: store straight into every rank's registered output (``Communicator.register``,
        ``graph_capture``) after an entry barrier, instead of pushing into the heap and copying out;
        every rank must pass the same."""
        check_input(x, self.comm.device, "all_to_all")
        w = self.world
        if x.numel() % w:
            raise InvalidInputError(f"all_to_all: {x.numel()} elements do not split into {w} equal shards")
        m = x.numel() // w
        if out is not None:
            check_out(out, x, x.numel(), "all_to_all", may_alias=False)
        self.check()
        if out is None:
            out = torch.empty_like(x)
        if m == 0:
            self._nothing_to_move(x.dtype)
            return out
        nbytes = x.numel() * x.element_size()
        if self._too_large(x, m, nbytes, "all_to_all"):
            dist.all_to_all_single(out, x, group=self.fallback_group)
            return out
        dest = NO_PEER_OUTPUT
        if direct:
            dest = self._peer_output(out, heap=False)
            if not dest.row:
                raise InvalidInputError("all_to_all: direct=True needs an output registered with "
                                        "Communicator.register (or met inside graph_capture)")
        self._launch("direct" if dest.row else "push", x, out, m, nbytes, dest)
        return out


class ReduceScatter(_PushCollective):
    """``out = (sum over ranks of x)[rank * m : (rank + 1) * m]`` with ``m = x.numel() / world``
    (``reduce_scatter_tensor``). ``max_bytes`` bounds the *input* size. Sum in fp32, ranks in order.
    Workspace: about 2 x ``max_bytes`` per rank."""

    op = "reducescatter"
    ALGORITHMS = MappingProxyType({cls.name: cls for cls in (ReduceScatterPush,)})

    def __init__(self, comm: Communicator, max_bytes: int | None = None, *, table: SelectionTable | None = None,
                 fallback_group: dist.ProcessGroup | None = None, name: str = "reducescatter") -> None:
        super().__init__(comm, max_bytes, table, fallback_group, name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum",
                 sizes: Sequence[int] | None = None) -> torch.Tensor:
        """``sizes`` (``reduce_scatterv``): rows (along dim 0) of every rank's part of ``x``, the same
        list on every rank, summing to ``x``'s rows; ``out`` then holds this rank's rows, after those
        of the ranks before it. Unequal sizes use the same kernel with shards at their offsets."""
        check_input(x, self.comm.device, "reduce_scatter")
        check_op(op, "reduce_scatter")
        if sizes is not None:
            rows = self._rows(sizes, None, "reduce_scatter")  # this rank's count is read from x below
            if rows is not None:
                return self._scatterv(x, out, rows)
        w = self.world
        if x.numel() % w:
            raise InvalidInputError(f"reduce_scatter: {x.numel()} elements do not split into {w} equal shards")
        m = x.numel() // w
        if out is not None:
            check_out(out, x, m, "reduce_scatter", may_alias=False)
        self.check()
        if out is None:
            out = x.new_empty((x.shape[0] // w, *x.shape[1:]) if x.dim() and x.shape[0] % w == 0 else (m,))
        if m == 0:
            self._nothing_to_move(x.dtype)
            return out
        if self._too_large(x, m, x.numel() * x.element_size(), "reduce_scatter"):
            dist.reduce_scatter_tensor(out, x, group=self.fallback_group)
            return out
        self._launch("push", x, out, m, x.numel() * x.element_size(), NO_PEER_OUTPUT)
        return out

    def _scatterv(self, x: torch.Tensor, out: torch.Tensor | None, rows: tuple[int, ...]) -> torch.Tensor:
        total, mine = sum(rows), rows[self.comm.rank]
        if x.dim() == 0 or x.shape[0] != total:
            raise InvalidInputError(f"reduce_scatter: x has {x.shape[0] if x.dim() else 0} rows, sizes sum to {total}")
        row = int(torch.Size(x.shape[1:]).numel())
        if out is not None:
            check_out(out, x, mine * row, "reduce_scatter", may_alias=False)
        self.check()
        if out is None:
            out = x.new_empty((mine, *x.shape[1:]))
        if total == 0 or row == 0:
            self._nothing_to_move(x.dtype)
            return out
        if self._var_too_large(x, rows, row, "reduce_scatter"):
            summed = x.clone()
            dist.all_reduce(summed, group=self.fallback_group)
            start = sum(rows[:self.comm.rank])
            out.copy_(summed[start:start + mine].view(out.shape))
            return out
        self._launch_var(x, out, rows, row)
        return out
