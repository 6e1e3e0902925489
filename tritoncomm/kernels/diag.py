"""Diagnostics that a bounded wait leaves behind when it gives up.

Every communicator owns one small record of int64 words that kernels write when a wait expires and
that the host reads without synchronising (pinned, device-mapped memory on the GPU; plain memory in
the CPU world). The first expired wait claims the record; later waits in the same or other programs
see the claim and stop waiting at once instead of each running out its own time limit.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import INTERPRET

__all__ = ["DIAG_WORDS", "KIND_NAMES", "KIND_SIGNATURE", "record_timeout", "F"]

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
#: The record's kind for a call whose signature differs from a peer's (``barrier``, ``lamport``'s
#: headers): rank, peer, slot, this rank's signature, the peer's.
KIND_SIGNATURE = tl.constexpr(5)
KIND_NAMES = {1: "signal wait", 2: "LL packet poll", 3: "cross-rank consistency check", 4: "Lamport buffer poll",
              5: "call signature check"}


#: The GPU's record, made by one thread alone: claim word 0 (0 -> -1), fill words 1-7, then publish
#: the kind in word 0 with a release exchange (the record's only ordering, on the failure path).
#: Operands: the record's address, rank, peer, slot, expected, seen, program, spins, kind (int64).
_RECORD_PTX = tl.constexpr("""{
    .reg .b64 %old, %free, %busy;
    .reg .pred %won;
    mov.b64 %free, 0;
    mov.b64 %busy, -1;
    atom.global.relaxed.sys.cas.b64 %old, [$1], %free, %busy;
    setp.eq.b64 %won, %old, 0;
    @%won st.relaxed.sys.global.b64 [$1+8], $2;
    @%won st.relaxed.sys.global.b64 [$1+16], $3;
    @%won st.relaxed.sys.global.b64 [$1+24], $4;
    @%won st.relaxed.sys.global.b64 [$1+32], $5;
    @%won st.relaxed.sys.global.b64 [$1+40], $6;
    @%won st.relaxed.sys.global.b64 [$1+48], $7;
    @%won st.relaxed.sys.global.b64 [$1+56], $8;
    @%won atom.global.sys.release.exch.b64 %old, [$1], $9;
    mov.b32 $0, 0;
}""")


@triton.jit
def record_timeout(diag, kind, rank, peer, slot, expected, seen, spins):
    """Claim the record (first writer wins) and fill it. ``diag`` points at int64 words.

    Any thread that calls it can claim and fill the record alone. On GPUs every calling thread makes
    its own compare-and-swap, and the winner its own stores: no CTA barrier and no first-thread
    predicate (Triton's scalar atomics and stores run on a program's first thread only), so a wait
    that expires in some warps of a program while the others have left it, or have ended, is still
    recorded."""
    if INTERPRET:
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
            tl.atomic_xchg(diag, tl.full([], kind, tl.int64), sem="release", scope="sys")
    else:
        tl.inline_asm_elementwise(
            _RECORD_PTX, "=r,l,l,l,l,l,l,l,l,l",
            [diag.to(tl.int64), tl.cast(rank, tl.int64), tl.cast(peer, tl.int64), tl.cast(slot, tl.int64),
             tl.cast(expected, tl.int64), tl.cast(seen, tl.int64), tl.cast(tl.program_id(0), tl.int64),
             tl.cast(spins, tl.int64), tl.cast(kind, tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def already_failed(diag):
    """True once any wait of this communicator has given up (relaxed read of the record)."""
    return tl.load(diag, volatile=True) != 0
