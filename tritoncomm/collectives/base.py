"""What every collective's host side shares: algorithms as objects, the registry that names them,
the selection table, debug-mode signatures and the NCCL fallback.

An *algorithm* (``Algorithm``) is one kernel and its launcher: its name, its default launch shape,
the most bytes it can ever serve, what it needs in the heap for the largest message it must serve
(``layout``), the launch shapes ``tune`` tries (``candidates``) and its ``launch``. A collective
(``CollectiveBase``) keeps a registry of algorithm classes (``ALGORITHMS``, in a fixed order: the
order gives the debug-mode codes and breaks ties); at set-up it creates one instance per algorithm
it will use, each owning one channel; a call validates, selects, and launches one of them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ..channels import Channel, Communicator
from ..errors import InvalidInputError, SetupMismatchError, TritonCommError
from ..kernels.consistency import DTYPE_CODES, FALLBACK_CODE, OP_CODES, pack_signature
from ..kernels.launcher import Launcher
from .selection import DTYPES, Choice, SelectionTable, read_table
from .validation import DTYPE_NAMES

__all__ = ["Algorithm", "CollectiveBase", "PeerOutput", "Plans", "Workspace"]

log = logging.getLogger("tritoncomm")


@dataclass(frozen=True)
class Workspace:
    """What an algorithm needs in every rank's heap: barrier slots and buffer bytes, of which the
    first ``lamport_bytes`` start at rest as Lamport buffers (``Channel``)."""

    barrier_slots: int = 0
    buffer_bytes: int = 0
    lamport_bytes: int = 0


@dataclass(frozen=True)
class PeerOutput:
    """Where peers can store straight into this call's output: a symmetric tensor's heap offset
    (``heap_off >= 0``, the same on every rank), or the device address of the output's registered
    row (``row != 0``, see ``Communicator.peer_row``); neither: peers cannot."""

    heap_off: int = -1
    row: int = 0

    def signature(self, comm: Communicator) -> tuple[bool, int, int]:
        """What debug mode compares across ranks: the form, the offset, the registered slot."""
        return self.heap_off >= 0, max(self.heap_off, 0), comm.peer_slot(self.row) if self.row else -1


NO_PEER_OUTPUT = PeerOutput()


class Algorithm:
    """One algorithm of a collective (see the module docstring). Subclasses set ``name`` and
    ``shapes`` (``backend -> (programs, block, warps)``, the launch shape when no table row names
    the algorithm) and implement ``layout`` and their family's ``launch``.

    An instance serves messages up to ``capacity`` bytes with a fixed grid of ``grid`` programs
    (a captured CUDA graph keeps its grid; programs past a call's choice only advance their
    epochs). Creating it is collective (its channel); so is ``close``."""

    name: ClassVar[str]
    shapes: ClassVar[Mapping[str, tuple[int, int, int]]]
    #: The ``@triton.jit`` kernel ``launch`` runs, through ``self.launcher`` (on this instance's grid).
    kernel: ClassVar[Any] = None
    #: The most bytes this algorithm can ever serve (None: no limit of its own).
    limit: ClassVar[int | None] = None
    #: Whether peers may store into the output directly (``PeerOutput``).
    writes_peer_outputs: ClassVar[bool] = False
    #: Whether the kernel meets peers at cross-rank barriers (such grids stay within ``tools.tune``'s
    #: caps on programs and warps).
    barriers: ClassVar[bool] = True
    #: Whether the kernel supports programmatic dependent launch (it calls ``kernels.pdl_wait`` before
    #: touching memory): launched so on GPUs that have it (sm_90+), to overlap its start with the
    #: previous kernel's end.
    pdl: ClassVar[bool] = False

    def __init__(self, comm: Communicator, capacity: int, grid: int, tag: str) -> None:
        self.comm, self.capacity, self.grid, self.world = comm, capacity, grid, comm.world
        pdl = self.pdl and comm.backend == "cuda" and torch.cuda.get_device_capability(comm.device)[0] >= 9
        #: Extra launch options of the kernel (set once here: nothing is decided on the launch path).
        self.launch_opts: dict[str, bool] = {"launch_pdl": True} if pdl else {}
        self.launcher = Launcher(self.kernel, (grid,)) if self.kernel is not None else None
        ws = self.layout()
        self.channel = Channel(comm, tag, programs=grid, barrier_slots=ws.barrier_slots,
                               buffer_bytes=ws.buffer_bytes, lamport_bytes=ws.lamport_bytes)

    def layout(self) -> Workspace:
        """Size this instance's buffers for ``capacity`` bytes (set the fields ``launch`` reads)."""
        raise NotImplementedError

    @classmethod
    def default_choice(cls, backend: str) -> Choice:
        return Choice(cls.name, *cls.shapes["cuda" if backend == "cuda" else "cpu"])

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        """Launch shapes ``tune`` tries for a message of ``nbytes`` (none: never tuned)."""
        return []

    @property
    def heap_bytes(self) -> int:
        return self.channel.heap_bytes

    def close(self) -> None:
        self.channel.close()


class Plans(dict):
    """Launch plans of one collective by call key, valid for one selection table (``table``): a
    bounded per-instance memo of what the table picks, so that the launch path looks it up once."""

    #: Keys kept; past this many, further plans are computed on every call.
    MAX = 1024

    def __init__(self) -> None:
        super().__init__()
        self.table: object = None

    def keep(self, key: object, plan: object) -> None:
        if len(self) < self.MAX:
            self[key] = plan


class CollectiveBase:
    """Owns one algorithm instance per algorithm set up; creation and ``close`` are collective.

    Subclasses set ``op`` (the table's op), ``debug_op`` (the op named in debug-mode signatures,
    default ``op``) and ``ALGORITHMS`` (name -> ``Algorithm`` subclass, in registry order)."""

    op: ClassVar[str] = ""
    debug_op: ClassVar[str] = ""
    ALGORITHMS: ClassVar[Mapping[str, type[Algorithm]]] = {}

    def __init__(self, comm: Communicator, *, table: SelectionTable | None, fallback_group: dist.ProcessGroup | None,
                 name: str) -> None:
        comm.require_open(name)
        self.comm = comm
        self.name = name
        #: What the calls' signatures are made of, fixed at set-up (``_signature``, ``_debug_check``):
        #: the op's code, each algorithm's (its position in ``ALGORITHMS``, from 1), whether to check.
        self._op_code = OP_CODES[self.debug_op or self.op]
        self._algo_codes = {n: i + 1 for i, n in enumerate(self.ALGORITHMS)}
        self._check_calls = comm.config.check_calls
        self.world = comm.world
        device_name = torch.cuda.get_device_name(comm.device) if comm.backend == "cuda" else ""
        self.table = table or read_table(comm.backend, device_name)
        #: The family's own rows, where the table has none for this op and world.
        self._defaults = self.default_rows(comm.backend, min(self.world, 8)) if self.op else []
        if self.op:
            self.table.check_algorithms(self.op, self._table_names())
        self.fallback_group = fallback_group
        self._algos: dict[str, Algorithm] = {}
        self._closed = False
        self._warned_fallback = False
        digests = comm.bootstrap.all_gather(self.table.digest())
        if any(d != digests[0] for d in digests):
            raise SetupMismatchError(f"{name}: ranks loaded different selection tables ({digests}); every rank "
                                     "must make the same algorithm choice")

    def check(self) -> None:
        """Raise if a call cannot be served: ``TritonCommError`` once this collective (or its
        communicator) is closed, ``CommTimeoutError`` once a wait expired (``Communicator.check``).
        Host-only, no synchronisation."""
        if self._closed:
            raise TritonCommError(f"{self.name} is closed")
        self.comm.check()

    # -- set-up --------------------------------------------------------------------------------
    @classmethod
    def default_rows(cls, backend: str, world: int) -> list[tuple[int, Choice]]:
        """The family's rules of thumb, rows of ``(max_bytes, Choice)``, for ``backend`` at ``world``:
        what serves where the table has no rows. Families with an ``op`` define it."""
        raise NotImplementedError(f"{cls.__name__} declares no default rows")

    def _table_names(self) -> tuple[str, ...]:
        """The algorithm names this collective's table rows may use."""
        return tuple(self.ALGORITHMS)

    def _setup(self, capacities: Mapping[str, int], grids: Mapping[str, int] | None = None, **extra: object) -> None:
        """Create the algorithms named in ``capacities`` (each for messages up to that many bytes,
        capped at its ``limit``; ``extra``: further constructor arguments of the family), in registry
        order; on failure close what was made and re-raise."""
        try:
            for name, cls in self.ALGORITHMS.items():
                if name in capacities:
                    cap = capacities[name] if cls.limit is None else min(capacities[name], cls.limit)
                    grid = grids[name] if grids is not None else self._grid_for(name)
                    self._algos[name] = cls(self.comm, cap, grid, f"{self.name}.{name}", **extra)
        except BaseException:
            self.close()
            raise
        self.comm.bootstrap.barrier()

    def _check_names(self, algos: object) -> None:
        if algos is not None and any(a not in self.ALGORITHMS for a in algos):  # type: ignore[union-attr]
            raise InvalidInputError(f"unknown {self.op or self.debug_op} algorithm in {algos}; known: "
                                    f"{tuple(self.ALGORITHMS)}")

    def _grid_for(self, algo: str) -> int:
        """Programs in ``algo``'s (fixed) grid: the most that any row of the table asks for."""
        rows = self.table.choices(self.op, self.world, self._defaults) + self._defaults
        first = self.ALGORITHMS[algo].default_choice(self.comm.backend).programs
        return max([first, *(c.programs for _, c in rows if c.algo == algo)])

    def _capacities(self, max_bytes: int, algos: tuple[str, ...] | dict[str, int] | None) -> dict[str, int]:
        """Largest message each algorithm must serve: what the table routes to it up to ``max_bytes``;
        or ``max_bytes`` for every algorithm named in ``algos``; or, if ``algos`` maps algorithms to
        sizes, those sizes (capped at ``max_bytes``)."""
        if isinstance(algos, dict):
            return {a: min(c, max_bytes) for a, c in algos.items()}
        if algos is not None:
            return {a: max_bytes for a in algos}
        caps: dict[str, int] = {}
        for dtype in DTYPES:
            lo = 0
            rows = self.table.entries(self.op, self.world, dtype, self._defaults)
            for i, (hi, c) in enumerate(rows):
                if lo < max_bytes:
                    top = max_bytes if i == len(rows) - 1 else min(hi, max_bytes)  # the last row serves the rest
                    caps[c.algo] = max(caps.get(c.algo, 0), top)
                lo = hi
        return caps

    # -- selection -----------------------------------------------------------------------------
    def _choice(self, algo: str, dtype: str, nbytes: int) -> Choice:
        """The table's launch shape for ``algo`` at this size, or the nearest row that uses ``algo``;
        never more programs than its grid."""
        c = self.table.lookup(self.op, self.world, dtype, nbytes, self._defaults)
        if c.algo != algo:
            rows = [ch for _, ch in self.table.choices(self.op, self.world, self._defaults) if ch.algo == algo]
            c = rows[0] if rows else self.ALGORITHMS[algo].default_choice(self.comm.backend)
        grid = self._algos[algo].grid
        return c if c.programs <= grid else replace(c, programs=grid)

    def _first_serving(self, nbytes: int) -> str:
        """The first algorithm set up here (registry order) whose capacity covers ``nbytes``."""
        for name, a in self._algos.items():
            if nbytes <= a.capacity:
                return name
        raise InvalidInputError(f"{self.op}: no algorithm of this instance serves {nbytes} bytes "
                                f"(capacities {self.capacity})")

    # -- debug mode and fallback ---------------------------------------------------------------
    def _nothing_to_move(self, dtype: torch.dtype) -> None:
        """A call with no elements is a no-op on every rank (no kernel, no wait, nothing for the
        other ranks to pair with), by rule. In debug mode it still takes part in the ranks' signature
        check, with count 0: a rank that passes none where another passes some raises
        ``CollectiveMismatchError`` on both, instead of shifting the pairing of later calls."""
        self._debug_check(dtype, 0, "")

    def _signature(self, dtype: torch.dtype, count: int, algo: str) -> int | None:
        """The call's signature that the barriers compare (``kernels.barrier``): op, dtype, element
        count and the algorithm's code, as ``_debug_check`` numbers it; None where the communicator's
        ``check_calls`` is off (the kernels then compile without the check)."""
        if not self._check_calls:
            return None
        return pack_signature(self._op_code, DTYPE_CODES[DTYPE_NAMES[dtype]], count,
                              self._algo_codes.get(algo, FALLBACK_CODE))

    def _debug_check(self, dtype: torch.dtype, count: int, algo: str, variant: tuple = ()) -> None:
        """Debug mode: all ranks must call with the same (op, dtype, count, algorithm); ``variant``
        (e.g. the output's peer form and the launch shape) must agree too, folded into the algorithm
        word. The algorithm's code is its position in ``ALGORITHMS`` (from 1); the fallback's is
        ``FALLBACK_CODE``."""
        if self.comm.debug:
            code = self._algo_codes.get(algo, FALLBACK_CODE)
            if variant:  # a deterministic 40-bit digest above the algorithm code
                digest = int.from_bytes(hashlib.sha1(repr(variant).encode()).digest()[:5], "little")
                code |= digest << 8
            self.comm.debug_check(self._op_code, DTYPE_CODES[DTYPE_NAMES[dtype]], count, code)

    def _note_fallback(self, nbytes: int, limit: int) -> None:
        if not self._warned_fallback:
            self._warned_fallback = True
            log.warning("tritoncomm %s: %d bytes exceed max_bytes=%d; using torch.distributed (%s) for such sizes",
                        self.op, nbytes, limit, dist.get_backend(self.fallback_group))

    def _peer_output(self, out: torch.Tensor, *, heap: bool = True) -> PeerOutput:
        """Launch path (host-only): where peers can store into ``out`` (see ``PeerOutput``). Inside
        ``Communicator.graph_capture`` a regular output takes a fresh registered row."""
        row = self.comm.peer_row(out) or 0
        if row or not heap:
            return PeerOutput(row=row)
        off = self.comm.heap_offset(out)
        return PeerOutput(heap_off=off) if off is not None and off % 16 == 0 else NO_PEER_OUTPUT

    # -- what is set up ------------------------------------------------------------------------
    @property
    def algorithms(self) -> tuple[str, ...]:
        """The algorithms set up here, in registry order."""
        return tuple(self._algos)

    def algorithm(self, name: str) -> Algorithm:
        """The algorithm set up here as ``name``: its launch plan (``grid``, ``capacity``, ``heap_bytes``)
        and launcher, for inspection and measurement. Raises ``InvalidInputError`` for one not set up."""
        if name not in self._algos:
            raise InvalidInputError(f"{self.op}: no algorithm {name!r} here; set up: {self.algorithms}")
        return self._algos[name]

    @property
    def capacity(self) -> dict[str, int]:
        """The largest message (bytes) each algorithm set up here serves."""
        return {name: a.capacity for name, a in self._algos.items()}

    @property
    def workspace_bytes(self) -> int:
        """Heap bytes this collective holds on each rank."""
        return sum(a.heap_bytes for a in self._algos.values())

    def close(self) -> None:
        """Collective: return the workspace to the heap."""
        if self._closed:
            return
        self._closed = True
        for a in self._algos.values():
            a.close()
        self._algos.clear()
