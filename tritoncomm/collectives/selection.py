"""Which algorithm and launch shape serve a given (collective, world size, dtype, bytes).

The choices are data: a ``SelectionTable`` maps ``(op, world, dtype)`` to rows of
``(max_bytes, Choice)``; the first row whose ``max_bytes`` covers the message wins, and the last
row also serves anything larger (up to the collective's own ``max_bytes``). Tables measured on a
machine (``python -m tritoncomm tune``) ship in ``collectives/tables/<device>.json``; without one,
``default_table`` gives rules of thumb. Every rank reads the same table and so makes the same
choice for the same size; collectives also check the table's digest across ranks at set-up, and
that every algorithm it names is one of theirs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..units import NO_LIMIT
from .validation import DTYPE_NAMES

__all__ = ["DTYPES", "OPS", "Choice", "SelectionTable", "default_table", "load_table", "table_path"]

#: The collectives a table has rows for.
OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
#: The dtype keys of a table's rows.
DTYPES = tuple(DTYPE_NAMES.values())
TABLE_DIR = Path(__file__).with_name("tables")


@dataclass(frozen=True)
class Choice:
    """An algorithm and its launch shape: active programs, block size (elements; words for LL; at
    least one per thread), warps, and for the two-shot all-reduce its rounds (``None``: by size, see
    ``allreduce.twoshot.TwoShot.rounds_for``)."""

    algo: str
    programs: int
    block: int
    num_warps: int
    rounds: int | None = None

    def __post_init__(self) -> None:
        if self.programs < 1 or self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"bad launch shape {self}")
        if self.block & (self.block - 1) or self.block < 32 * self.num_warps:
            # a block smaller than the program's threads is copied across them, and the Lamport and
            # LL waits count one copy of a look (kernels.lamport): at least one element per thread
            raise ValueError(f"block must be a power of two of at least 32 x num_warps elements (LL: words), "
                             f"got {self.block} on {self.num_warps} warps")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be positive, got {self.rounds}")

    def to_json(self) -> dict:
        out = {"algo": self.algo, "programs": self.programs, "block": self.block, "num_warps": self.num_warps}
        if self.rounds is not None:
            out["rounds"] = self.rounds
        return out

    @classmethod
    def from_json(cls, e: dict) -> Choice:
        return cls(e["algo"], int(e["programs"]), int(e["block"]), int(e["num_warps"]),
                   int(e["rounds"]) if e.get("rounds") is not None else None)


class SelectionTable:
    """Rows of ``(max_bytes, Choice)`` per ``(op, world, dtype)``."""

    def __init__(self, rows: dict[tuple[str, int, str], list[tuple[int, Choice]]], source: str = "") -> None:
        for (op, _world, dtype), entries in rows.items():
            if op not in OPS or dtype not in DTYPES:
                raise ValueError(f"unknown table key {(op, dtype)}")
            if [b for b, _ in entries] != sorted(b for b, _ in entries) or not entries:
                raise ValueError(f"rows for {op}/{dtype} must be non-empty and sorted by max_bytes")
        self.rows = rows
        self.source = source
        #: The defaults this table falls back to, by backend, built once per table on first use (not per
        #: lookup: building them costs hundreds of microseconds).
        self._defaults: dict[str, SelectionTable] = {}

    def lookup(self, op: str, world: int, dtype: str, nbytes: int) -> Choice:
        entries = self.entries(op, world, dtype)
        for max_bytes, choice in entries:
            if nbytes <= max_bytes:
                return choice
        return entries[-1][1]

    def entries(self, op: str, world: int, dtype: str, backend: str = "cuda") -> list[tuple[int, Choice]]:
        """The rows for ``(op, world, dtype)``, ``backend``'s defaults where this table has none."""
        rows = self.rows.get((op, world, dtype))
        if rows:
            return rows
        if backend not in self._defaults:
            self._defaults[backend] = default_table(backend)
        return self._defaults[backend].rows[(op, min(world, 8), dtype)]

    def choices(self, op: str, world: int) -> list[tuple[int, Choice]]:
        """Every row for ``op`` at ``world`` (all dtypes)."""
        return [row for dtype in DTYPES for row in self.entries(op, world, dtype)]

    def check_algorithms(self, op: str, known: tuple[str, ...]) -> None:
        """Raise ``ValueError`` if a row of ``op`` names an algorithm not in ``known``."""
        for (o, world, dtype), entries in self.rows.items():
            bad = [c.algo for _, c in entries if o == op and c.algo not in known]
            if bad:
                raise ValueError(f"table {self.source!r}: {op} at world {world} ({dtype}) names {bad[0]!r}; "
                                 f"known: {known}")

    def digest(self) -> str:
        return hashlib.sha1(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        out: dict = {}
        for (op, world, dtype), entries in sorted(self.rows.items()):
            out.setdefault(op, {}).setdefault(str(world), {})[dtype] = [
                {"max_bytes": b, **c.to_json()} for b, c in entries]
        return out

    @classmethod
    def from_json(cls, data: dict, source: str = "") -> SelectionTable:
        rows = {}
        for op in OPS:
            for world, per_dtype in data.get(op, {}).items():
                for dtype, entries in per_dtype.items():
                    rows[(op, int(world), dtype)] = [(int(e["max_bytes"]), Choice.from_json(e)) for e in entries]
        return cls(rows, source)

    def merged(self, other: SelectionTable) -> SelectionTable:
        return SelectionTable({**self.rows, **other.rows}, other.source or self.source)


#: Three or more ranks: the Lamport one-shot moves (W-1) x S per GPU, so the default rules hand over to
#: its two-shot above this many bytes (measured on four H100s, ``docs/algorithms.md``); at two ranks
#: the one-shot serves up to its limit (it won there up to 4 MB on two H200s).
LAMPORT_ONESHOT_UP_TO_WIDE = 128 << 10


def _one_block(algo: str, elems: int, max_programs: int) -> Choice:
    """One block of 256 elements per program up to ``max_programs`` programs, then wider blocks (up to
    2048 elements on 4 warps): the shape the tuned tables chose at most sizes."""
    programs, block = max(1, -(-elems // 256)), 256
    while programs > max_programs and block < 2048:
        programs, block = -(-programs // 2), block * 2
    return Choice(algo, min(programs, max_programs), block, {256: 1, 512: 2, 1024: 2, 2048: 4}[block])


def _default_allreduce_cuda(world: int) -> list[tuple[int, Choice]]:
    """Rules of thumb on GPUs, in rows per power of two (bf16 elements; other dtypes take the same
    rows by bytes): the Lamport one-shot, its two-shot up to its limit, then the barrier two-shot.
    One rank keeps the LL / barrier rules (nothing crosses a link)."""
    from .allreduce.lamport import LAMPORT_MAX_PROGRAMS, LamportOneShot, LamportTwoShot  # it imports this module

    if world == 1:
        return [(128 << 10, Choice("ll", 16, 1024, 4)), (1 << 20, Choice("oneshot", 32, 4096, 8)),
                (NO_LIMIT, Choice("twoshot", 64, 4096, 8))]
    rows: list[tuple[int, Choice]] = []
    one = LamportOneShot.limit if world == 2 else LAMPORT_ONESHOT_UP_TO_WIDE
    nbytes = 2 << 10
    while nbytes <= LamportTwoShot.limit:
        if nbytes <= one:
            rows.append((nbytes, _one_block("lamport", nbytes // 2, LAMPORT_MAX_PROGRAMS)))
        else:
            rows.append((nbytes, _one_block("lamport_twoshot", nbytes // 2 // world, LAMPORT_MAX_PROGRAMS)))
        nbytes *= 2
    rows.append((NO_LIMIT, Choice("twoshot", 64, 8192, 8)))
    return rows


def default_table(backend: str = "cuda") -> SelectionTable:
    """Rules of thumb, used where no measured table has rows."""
    rows: dict[tuple[str, int, str], list[tuple[int, Choice]]] = {}
    big = NO_LIMIT
    for world in range(1, 9):
        for dtype in DTYPES:
            if backend == "cuda":
                ar = _default_allreduce_cuda(world)
                push = [(big, Choice("push", 32, 4096, 8))]
            else:  # the interpreter runs programs one after another: few programs, big blocks
                ar = [(16 << 10, Choice("ll", 2, 1024, 1)), (256 << 10, Choice("oneshot", 2, 2048, 1)),
                      (big, Choice("twoshot", 2, 2048, 1))]
                push = [(big, Choice("push", 2, 2048, 1))]
            rows[("allreduce", world, dtype)] = ar
            rows[("allgather", world, dtype)] = push
            rows[("reducescatter", world, dtype)] = push
            rows[("alltoall", world, dtype)] = push
    return SelectionTable(rows, f"default ({backend})")


def table_path(device_name: str) -> Path:
    slug = "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-")
    return TABLE_DIR / f"{slug}.json"


def load_table(backend: str, device_name: str = "") -> SelectionTable:
    """The measured table for this device merged over the defaults (CPU world: defaults only)."""
    base = default_table(backend)
    if backend != "cuda":
        return base
    path = table_path(device_name)
    if path.exists():
        data = json.loads(path.read_text())
        return base.merged(SelectionTable.from_json(data.get("table", data), str(path)))
    return base
