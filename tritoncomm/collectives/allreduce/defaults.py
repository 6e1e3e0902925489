"""The all-reduce's own default rows: the rules of thumb a device without a measured table (or a world
size its table has no rows for) takes. Rows of ``(max_bytes, Choice)`` as in ``selection``."""

from __future__ import annotations

from ...units import NO_LIMIT
from ..selection import Choice
from .lamport import LAMPORT_MAX_PROGRAMS, LamportOneShot
from .lamport_twoshot import LamportTwoShot

__all__ = ["LAMPORT_ONESHOT_UP_TO_WIDE", "default_rows", "one_block"]

#: Three or more ranks: the Lamport one-shot moves (W-1) x S per GPU, so the default rules hand over to
#: its two-shot above this many bytes (measured on four H100s, ``docs/algorithms.md``); at two ranks
#: the one-shot serves up to its limit (it won there up to 4 MB on two H200s).
LAMPORT_ONESHOT_UP_TO_WIDE = 128 << 10


def one_block(algo: str, elems: int, max_programs: int) -> Choice:
    """One block of 256 elements per program up to ``max_programs`` programs, then wider blocks (up to
    2048 elements on 4 warps): the shape the tuned tables chose at most sizes."""
    programs, block = max(1, -(-elems // 256)), 256
    while programs > max_programs and block < 2048:
        programs, block = -(-programs // 2), block * 2
    return Choice(algo, min(programs, max_programs), block, {256: 1, 512: 2, 1024: 2, 2048: 4}[block])


def default_rows(backend: str, world: int) -> list[tuple[int, Choice]]:
    """On GPUs, rows per power of two (bf16 elements; other dtypes take the same rows by bytes): the
    Lamport one-shot, its two-shot up to its limit, then the barrier two-shot; one rank keeps the LL /
    barrier rules (nothing crosses a link). In the CPU world, where the interpreter runs programs one
    after another: few programs, big blocks."""
    if backend != "cuda":
        return [(16 << 10, Choice("ll", 2, 1024, 1)), (256 << 10, Choice("oneshot", 2, 2048, 1)),
                (NO_LIMIT, Choice("twoshot", 2, 2048, 1))]
    if world == 1:
        return [(128 << 10, Choice("ll", 16, 1024, 4)), (1 << 20, Choice("oneshot", 32, 4096, 8)),
                (NO_LIMIT, Choice("twoshot", 64, 4096, 8))]
    rows: list[tuple[int, Choice]] = []
    one = LamportOneShot.limit if world == 2 else LAMPORT_ONESHOT_UP_TO_WIDE
    nbytes = 2 << 10
    while nbytes <= LamportTwoShot.limit:
        if nbytes <= one:
            rows.append((nbytes, one_block("lamport", nbytes // 2, LAMPORT_MAX_PROGRAMS)))
        else:
            rows.append((nbytes, one_block("lamport_twoshot", nbytes // 2 // world, LAMPORT_MAX_PROGRAMS)))
        nbytes *= 2
    rows.append((NO_LIMIT, Choice("twoshot", 64, 8192, 8)))
    return rows
