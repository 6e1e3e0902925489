"""Byte sizes as people write them: ``parse_size("2K") == 2048``, ``format_bytes(2048) == "2K"``."""

from __future__ import annotations

__all__ = ["format_bytes", "parse_size"]


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
