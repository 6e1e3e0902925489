"""Every family's default rows as one table (``default_table``), and a device's measured table over
them (``load_table``): what ``tune``, ``bench`` and the tests read. The collectives themselves read the
measured table (``selection.read_table``) and fall back to their own family's rows."""

from __future__ import annotations

from .allgather import AllGather, AllToAll, ReduceScatter
from .allreduce import AllReduce
from .selection import DTYPES, Choice, SelectionTable, read_table

__all__ = ["default_table", "load_table"]


def default_table(backend: str = "cuda") -> SelectionTable:
    """Every family's rules of thumb, at worlds 1 to 8 and every dtype."""
    rows: dict[tuple[str, int, str], list[tuple[int, Choice]]] = {}
    for coll in (AllReduce, AllGather, ReduceScatter, AllToAll):
        for world in range(1, 9):
            family = coll.default_rows(backend, world)
            for dtype in DTYPES:
                rows[(coll.op, world, dtype)] = family
    return SelectionTable(rows, f"default ({backend})")


def load_table(backend: str, device_name: str = "") -> SelectionTable:
    """The measured table for this device merged over the defaults (CPU world: defaults only)."""
    return default_table(backend).merged(read_table(backend, device_name))
