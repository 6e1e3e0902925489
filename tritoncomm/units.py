"""Sizes: as people write them (``parse_size("2K") == 2048``, ``format_bytes(2048) == "2K"``) and the
integer arithmetic that lays buffers out (``cdiv``, ``round_up``)."""

from __future__ import annotations

__all__ = ["NO_LIMIT", "cdiv", "format_bytes", "parse_size", "round_up"]

#: A byte count larger than any message: "no limit" (a selection table's last row, an unbounded size check).
NO_LIMIT = 1 << 62


def cdiv(x: int, m: int) -> int:
    """``ceil(x / m)`` for integers (``m > 0``)."""
    return -(-x // m)


def round_up(x: int, m: int) -> int:
    """The smallest multiple of ``m`` that is at least ``x``."""
    return cdiv(x, m) * m


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def format_bytes(n: int, *, sep: str = "", suffix: str = "") -> str:
    """``2048 -> "2K"`` (``sep=" ", suffix="B"``: ``"2 KB"``); sizes that are not a whole number of
    KiB or MiB stay plain numbers."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{sep}{unit}{suffix}"
    return str(n)
