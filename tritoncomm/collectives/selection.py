"""Which algorithm and launch shape serve a given (collective, world size, dtype, bytes).

The choices are data: a ``SelectionTable`` maps ``(op, world, dtype)`` to rows of
``(max_bytes, Choice)``; the first row whose ``max_bytes`` covers the message wins, and the last
row also serves anything larger (up to the collective's own ``max_bytes``). Tables measured on a
machine (``python -m tritoncomm tune``) ship in ``collectives/tables/<device>.json``; where a table has
no rows, each family's own rules of thumb serve (``CollectiveBase.default_rows``; all of them together:
``defaults.default_table``). This module holds only the data and its lookup. Every rank reads the
same table and so makes the same choice for the same size; collectives also check the table's digest
across ranks at set-up, and that every algorithm it names is one of theirs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .validation import DTYPE_NAMES

__all__ = ["DTYPES", "OPS", "PICK_OPS", "SWITCH_OPS", "Choice", "SelectionTable", "read_table", "table_path"]

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


#: The collectives a table has *picks* for: a variant by bytes, per world size, with no launch shape (the
#: variant sizes its own launch).
PICK_OPS = ("fused_norm",)
#: The collectives a table has *switches* for: named switch points (ints), per world size.
SWITCH_OPS = ("moe", "gemm")


class SelectionTable:
    """Rows of ``(max_bytes, Choice)`` per ``(op, world, dtype)``, picks ``(max_bytes, variant)`` per
    ``(op, world)`` for the ``PICK_OPS`` (the last row of either serves anything larger), and switch
    points ``{name: int}`` per ``(op, world)`` for the ``SWITCH_OPS``."""

    def __init__(self, rows: dict[tuple[str, int, str], list[tuple[int, Choice]]], source: str = "",
                 picks: dict[tuple[str, int], list[tuple[int, str]]] | None = None,
                 switches: dict[tuple[str, int], dict[str, int]] | None = None) -> None:
        for (op, _world, dtype), entries in rows.items():
            if op not in OPS or dtype not in DTYPES:
                raise ValueError(f"unknown table key {(op, dtype)}")
            if [b for b, _ in entries] != sorted(b for b, _ in entries) or not entries:
                raise ValueError(f"rows for {op}/{dtype} must be non-empty and sorted by max_bytes")
        picks = picks or {}
        for (op, _world), entries in picks.items():
            if op not in PICK_OPS or not entries or [b for b, _ in entries] != sorted(b for b, _ in entries):
                raise ValueError(f"picks for {op} must be of {PICK_OPS}, non-empty and sorted by max_bytes")
        switches = switches or {}
        for (op, _world), named in switches.items():
            if op not in SWITCH_OPS or not all(isinstance(v, int) for v in named.values()):
                raise ValueError(f"switches for {op} must be of {SWITCH_OPS}, ints by name")
        self.rows = rows
        self.source = source
        self.picks = picks
        self.switches = switches

    def entries(self, op: str, world: int, dtype: str,
                defaults: list[tuple[int, Choice]] | None = None) -> list[tuple[int, Choice]]:
        """The rows for ``(op, world, dtype)``, or ``defaults`` (the family's own) where this table has none."""
        rows = self.rows.get((op, world, dtype))
        if rows:
            return rows
        if defaults is None:
            raise KeyError(f"table {self.source!r} has no rows for {op} at world {world} ({dtype})")
        return defaults

    def lookup(self, op: str, world: int, dtype: str, nbytes: int,
               defaults: list[tuple[int, Choice]] | None = None) -> Choice:
        """The first row covering ``nbytes`` (the last row serves anything larger)."""
        entries = self.entries(op, world, dtype, defaults)
        for max_bytes, choice in entries:
            if nbytes <= max_bytes:
                return choice
        return entries[-1][1]

    def choices(self, op: str, world: int,
                defaults: list[tuple[int, Choice]] | None = None) -> list[tuple[int, Choice]]:
        """Every row for ``op`` at ``world`` (all dtypes)."""
        return [row for dtype in DTYPES for row in self.entries(op, world, dtype, defaults)]

    def switches_for(self, op: str, world: int) -> dict[str, int]:
        """The named switch points of ``op`` at ``world`` (empty where this table has none)."""
        return dict(self.switches.get((op, world), {}))

    def picks_for(self, op: str, world: int) -> list[tuple[int, str]] | None:
        """The picks for ``op`` at ``world``, or None where this table has none."""
        return self.picks.get((op, world))

    def check_algorithms(self, op: str, known: tuple[str, ...]) -> None:
        """Raise ``ValueError`` if a row (or pick) of ``op`` names an algorithm not in ``known``."""
        for (o, world, dtype), entries in self.rows.items():
            bad = [c.algo for _, c in entries if o == op and c.algo not in known]
            if bad:
                raise ValueError(f"table {self.source!r}: {op} at world {world} ({dtype}) names {bad[0]!r}; "
                                 f"known: {known}")
        for (o, world), entries in self.picks.items():
            bad = [a for _, a in entries if o == op and a not in known]
            if bad:
                raise ValueError(f"table {self.source!r}: {op} at world {world} picks {bad[0]!r}; known: {known}")

    def digest(self) -> str:
        return hashlib.sha1(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        out: dict = {}
        for (op, world, dtype), entries in sorted(self.rows.items()):
            out.setdefault(op, {}).setdefault(str(world), {})[dtype] = [
                {"max_bytes": b, **c.to_json()} for b, c in entries]
        for (op, world), picks in sorted(self.picks.items()):
            out.setdefault("picks", {}).setdefault(op, {})[str(world)] = [{"max_bytes": b, "algo": a} for b, a in picks]
        for (op, world), named in sorted(self.switches.items()):
            out.setdefault("switches", {}).setdefault(op, {})[str(world)] = dict(sorted(named.items()))
        return out

    @classmethod
    def from_json(cls, data: dict, source: str = "") -> SelectionTable:
        rows = {}
        for op in OPS:
            for world, per_dtype in data.get(op, {}).items():
                for dtype, entries in per_dtype.items():
                    rows[(op, int(world), dtype)] = [(int(e["max_bytes"]), Choice.from_json(e)) for e in entries]
        picks = {(op, int(world)): [(int(e["max_bytes"]), str(e["algo"])) for e in entries]
                 for op, per_world in data.get("picks", {}).items() for world, entries in per_world.items()}
        switches = {(op, int(world)): {k: int(v) for k, v in named.items()}
                    for op, per_world in data.get("switches", {}).items() for world, named in per_world.items()}
        return cls(rows, source, picks, switches)

    def merged(self, other: SelectionTable) -> SelectionTable:
        return SelectionTable({**self.rows, **other.rows}, other.source or self.source, {**self.picks, **other.picks},
                              {**self.switches, **other.switches})


def table_path(device_name: str) -> Path:
    slug = "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-")
    return TABLE_DIR / f"{slug}.json"


def read_table(backend: str, device_name: str = "") -> SelectionTable:
    """The measured table shipped for this device (``tables/<device>.json``); empty in the CPU world or
    for a device without one. Where it has no rows, a collective takes its family's own defaults
    (``CollectiveBase.default_rows``)."""
    if backend != "cuda":
        return SelectionTable({}, f"none ({backend})")
    path = table_path(device_name)
    if not path.exists():
        return SelectionTable({}, f"none ({device_name or 'no device'})")
    data = json.loads(path.read_text())
    return SelectionTable.from_json(data.get("table", data), str(path))
