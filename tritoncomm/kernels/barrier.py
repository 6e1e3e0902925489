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
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .backend import MAX_WORLD
from .memory import heap_base
from .signals import signal, wait

__all__ = ["barrier", "barrier_arrive", "barrier_flag_bytes", "barrier_wait"]

#: Each program's first warp alone stores the barrier's flags (after a CTA barrier) and polls them (the
#: other warps wait at a CTA barrier): one system-scope release and one stream of system-scope acquire
#: loads per program, not per warp. Every warp doing both stalls grids of many warps for milliseconds
#: in some CUDA-graph replays ("Slow replays" in ``docs/moe.md``).
#: ``TRITONCOMM_BARRIER_ALL_WARPS=1`` (read once at import) makes every warp do both, for comparisons.
_FIRST_WARP = tl.constexpr(os.environ.get("TRITONCOMM_BARRIER_ALL_WARPS", "0") != "1")


def barrier_flag_bytes(slots: int) -> int:
    """Bytes of flag storage that ``slots`` barrier slots need in every rank's heap."""
    return slots * MAX_WORLD.value * 4


@triton.jit
def barrier_arrive(bases, rank, world, flags_off, slot, epoch):
    """First half of ``barrier``: publish this program's writes and mark slot ``slot`` as reached
    (epoch ``epoch``) in every rank's flag table, this rank's included. Does not wait."""
    lanes = tl.arange(0, MAX_WORLD)
    peers = tl.where(lanes < world, lanes, rank)
    remote = (heap_base(bases, peers) + flags_off + (slot * MAX_WORLD + rank) * 4).to(tl.pointer_type(tl.uint32))
    signal(remote, epoch, _FIRST_WARP)


@triton.jit
def barrier_wait(bases, rank, world, flags_off, slot, epoch, timeout, diag):
    """Second half of ``barrier``: wait until every rank has arrived at ``slot`` with ``epoch``;
    afterwards their writes made before arriving are visible to this program (acquire)."""
    lanes = tl.arange(0, MAX_WORLD)
    peers = tl.where(lanes < world, lanes, rank)
    local = (heap_base(bases, rank) + flags_off + (slot * MAX_WORLD + peers) * 4).to(tl.pointer_type(tl.uint32))
    wait(local, epoch, peers, slot, rank, timeout, diag, _FIRST_WARP)


@triton.jit
def barrier(bases, rank, world, flags_off, slot, epoch, timeout, diag):
    """Cross-rank barrier on ``slot`` of the flag table at heap offset ``flags_off``."""
    barrier_arrive(bases, rank, world, flags_off, slot, epoch)
    barrier_wait(bases, rank, world, flags_off, slot, epoch, timeout, diag)
