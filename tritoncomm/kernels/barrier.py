"""A barrier across ranks between *matching* programs (same program id on every rank).

Each rank owns, for every barrier slot, one flag per source rank in its heap. Program ``pid`` of
rank ``r`` signals by storing the epoch into slot ``slot``, lane ``r`` of every peer's flags, then
waits until all lanes of its own slot reach the epoch. Only the program's first warp stores and polls
the flags; CTA barriers order the other warps' writes before its release and their later reads
after its acquire.

Contract: when ``barrier`` returns in program ``pid`` of rank ``r``, every write that program
``pid`` of any rank made before entering the barrier (with the same slot and epoch) is visible to
all threads of program ``pid`` on rank ``r``. Nothing is said about other programs: a barrier
between all programs of a grid would need them all resident at once (and the CPU interpreter runs
programs one after another), so collectives split their work so that program ``pid`` only talks to
program ``pid``. Epochs must grow from one use of a slot to the next (``signals.epoch_next``).

``barrier_arrive`` and ``barrier_wait`` are the two halves, for pipelines that arrive at one slot,
do other work, and wait on it (or on another slot) later.

Signatures: with ``sig`` (an int64 that names the call, ``consistency.pack_signature``) a rank stores
its signature beside its flag in every peer's entry before it signals (the signal's release covers
it), and after the wait compares every rank's with its own. The first that differs is recorded
(kind ``KIND_SIGNATURE``: rank, peer, slot, this rank's signature, the peer's) and the barrier
returns False: the caller then writes no output. Every rank compares every signature, so every
rank finds the mismatch. Without ``sig`` nothing is stored or compared and the barrier returns
True. Each entry holds the flag (uint32) and two signature words (int64, at bytes 8 and 16), used
by epoch parity: a peer that has passed this barrier may already arrive at it in its next launch
(the epoch after) before this rank has read the signature, and must not overwrite it; it cannot
get two launches ahead, since its next launch's barrier waits for this rank. 32 bytes an entry.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import settings
from .backend import MAX_WORLD
from .diag import KIND_SIGNATURE, record_timeout
from .memory import heap_base
from .signals import signal, wait

__all__ = ["KIND_SIGNATURE", "barrier", "barrier_arrive", "barrier_flag_bytes", "barrier_wait"]

#: Bytes of one rank's entry in a slot: the flag, then the signatures of even and odd epochs at bytes 8, 16.
_ENTRY = tl.constexpr(32)

#: Each program's first warp alone stores the barrier's flags (after a CTA barrier) and polls them (the
#: other warps wait at a CTA barrier): one system-scope release and one stream of system-scope acquire
#: loads per program, not per warp. Every warp doing both stalls grids of many warps for milliseconds
#: in some CUDA-graph replays ("Slow replays" in ``docs/moe.md``).
#: ``TRITONCOMM_BARRIER_ALL_WARPS=1`` (read once at import) makes every warp do both, for comparisons.
_FIRST_WARP = tl.constexpr(not settings.BARRIER_ALL_WARPS.get())


def barrier_flag_bytes(slots: int) -> int:
    """Bytes of flag storage that ``slots`` barrier slots need in every rank's heap."""
    return slots * MAX_WORLD.value * _ENTRY.value


@triton.jit
def barrier_arrive(bases, rank, world, flags_off, slot, epoch, sig=None):
    """First half of ``barrier``: publish this program's writes (and ``sig``) and mark slot ``slot``
    as reached (epoch ``epoch``) in every rank's flag table, this rank's included. Does not wait."""
    lanes = tl.arange(0, MAX_WORLD)
    peers = tl.where(lanes < world, lanes, rank)
    entry = heap_base(bases, peers) + flags_off + (slot * MAX_WORLD + rank) * _ENTRY
    if sig is not None:
        at = entry + 8 + (tl.cast(epoch, tl.uint32) & 1).to(tl.int64) * 8
        tl.store(at.to(tl.pointer_type(tl.int64)), sig + tl.zeros([MAX_WORLD], tl.int64))
    signal(entry.to(tl.pointer_type(tl.uint32)), epoch, _FIRST_WARP)


@triton.jit
def barrier_wait(bases, rank, world, flags_off, slot, epoch, timeout, diag, sig=None):
    """Second half of ``barrier``: wait until every rank has arrived at ``slot`` with ``epoch``;
    afterwards their writes made before arriving are visible to this program (acquire). Returns
    whether every rank's signature equals ``sig`` (True without ``sig``; module docstring)."""
    lanes = tl.arange(0, MAX_WORLD)
    peers = tl.where(lanes < world, lanes, rank)
    entry = heap_base(bases, rank) + flags_off + (slot * MAX_WORLD + peers) * _ENTRY
    wait(entry.to(tl.pointer_type(tl.uint32)), epoch, peers, slot, rank, timeout, diag, _FIRST_WARP)
    same = tl.full([], 1, tl.int1)
    if sig is not None:
        at = entry + 8 + (tl.cast(epoch, tl.uint32) & 1).to(tl.int64) * 8
        theirs = tl.load(at.to(tl.pointer_type(tl.int64)), mask=lanes < world, other=sig)
        differ = theirs != sig
        if tl.sum(differ.to(tl.int32), axis=0) > 0:
            peer = tl.min(tl.where(differ, lanes, MAX_WORLD), axis=0)
            record_timeout(diag, KIND_SIGNATURE, rank, peer, slot, sig, tl.sum(tl.where(lanes == peer, theirs, 0),
                                                                               axis=0), 0)
            same = tl.full([], 0, tl.int1)
    return same


@triton.jit
def barrier(bases, rank, world, flags_off, slot, epoch, timeout, diag, sig=None):
    """Cross-rank barrier on ``slot`` of the flag table at heap offset ``flags_off``; returns whether
    every rank's signature equals ``sig`` (True without ``sig``)."""
    barrier_arrive(bases, rank, world, flags_off, slot, epoch, sig)
    return barrier_wait(bases, rank, world, flags_off, slot, epoch, timeout, diag, sig)
