"""What a dispatch leaves its combine: one small header in the rank's own memory.

``combine`` needs the call's token count of every rank (its mode and its split of every source's
tokens) and the half of the tables the dispatch wrote. Read from the tables themselves, that is two
loads one after the other (the send channel's epoch, then the count table's half). Instead program
0 of the dispatch's last kernel stores a header at its end: the counts at ``header[0:WORLD]``, the
half at ``header[BLOCK_W]``; ``combine`` loads both at once. The header is local (never in a peer's
memory): the next dispatch writes it only after its ``pdl_wait``, once the combine before it has
ended.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["load_header", "size_of", "store_header"]


@triton.jit
def store_header(header, sizes, half, BLOCK_W: tl.constexpr):
    """Store ``sizes`` (``[BLOCK_W]`` int32: every rank's token count, 0 past the world) and
    ``half`` (the tables' half, 0 or 1)."""
    ws = tl.arange(0, BLOCK_W)
    tl.store(header + ws, sizes.to(tl.int32))
    tl.store(header + BLOCK_W, half.to(tl.int32))


@triton.jit
def load_header(header, BLOCK_W: tl.constexpr):
    """``(sizes [BLOCK_W] int32, half int64)``: the two loads are in flight together."""
    sizes = tl.load(header + tl.arange(0, BLOCK_W))
    half = tl.load(header + BLOCK_W).to(tl.int64)
    return sizes, half


@triton.jit
def size_of(sizes, s, BLOCK_W: tl.constexpr):
    """Rank ``s``'s token count from a header's ``sizes``, in registers."""
    return tl.sum(tl.where(tl.arange(0, BLOCK_W) == s, sizes, 0), axis=0)
