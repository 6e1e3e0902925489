"""Diagnostics that a bounded wait leaves behind when it gives up.

Every communicator owns one small record of int64 words that kernels write when a wait expires and
that the host reads without synchronising (pinned, device-mapped memory on the GPU; plain memory in
the CPU world). The first expired wait claims the record; later waits in the same or other programs
see the claim and stop waiting at once instead of each running out its own time limit.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["DIAG_WORDS", "KIND_NAMES", "record_timeout", "F"]

#: Number of int64 words in a diagnostic record.
DIAG_WORDS = 8


class F:
    """Word offsets in the record."""

    STATUS = 0  # 0: clean, -1: being written, >0: the kind of failure (KIND_NAMES)
    RANK = 1
    PEER = 2
    SLOT = 3
    EXPECTED = 4
    SEEN = 5
    PROGRAM = 6
    SPINS = 7


# The same offsets as constexprs, for use inside kernels.
_RANK = tl.constexpr(F.RANK)
_PEER = tl.constexpr(F.PEER)
_SLOT = tl.constexpr(F.SLOT)
_EXPECTED = tl.constexpr(F.EXPECTED)
_SEEN = tl.constexpr(F.SEEN)
_PROGRAM = tl.constexpr(F.PROGRAM)
_SPINS = tl.constexpr(F.SPINS)

#: STATUS values (>0) and what they name in error messages.
KIND_NAMES = {1: "signal wait", 2: "LL packet poll", 3: "cross-rank consistency check", 4: "Lamport buffer poll"}


@triton.jit
def record_timeout(diag, kind, rank, peer, slot, expected, seen, spins):
    """Claim the record (first writer wins) and fill it. ``diag`` points at int64 words."""
    old = tl.atomic_cas(diag, tl.full([], 0, tl.int64), tl.full([], -1, tl.int64), sem="relaxed",
                        scope="sys")
    if old == 0:
        tl.store(diag + _RANK, tl.cast(rank, tl.int64))
        tl.store(diag + _PEER, tl.cast(peer, tl.int64))
        tl.store(diag + _SLOT, tl.cast(slot, tl.int64))
        tl.store(diag + _EXPECTED, tl.cast(expected, tl.int64))
        tl.store(diag + _SEEN, tl.cast(seen, tl.int64))
        tl.store(diag + _PROGRAM, tl.cast(tl.program_id(0), tl.int64))
        tl.store(diag + _SPINS, tl.cast(spins, tl.int64))
        tl.debug_barrier()
        tl.atomic_xchg(diag, tl.full([], kind, tl.int64), sem="release", scope="sys")


@triton.jit
def already_failed(diag):
    """True once any wait of this communicator has given up (relaxed read of the record)."""
    return tl.load(diag, volatile=True) != 0
