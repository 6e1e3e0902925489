"""Signals and waits on 32-bit flags in the symmetric heap, and the epochs that drive them.

A *flag* is a uint32 in some rank's heap. A producer *signals* by storing a value into it (usually
in a peer's heap); a consumer *waits* on flags in its own heap until each has reached an expected
value. Values only grow (modulo 2**32): a wait is satisfied by ``flag - expected >= 0`` in
wrap-around arithmetic, so an old flag can never satisfy a newer wait and counters may wrap.

Epochs give each kernel launch a fresh expected value without touching kernel arguments, so the
same launch can be captured in a CUDA graph and replayed: a program keeps its epoch in device
memory, reads it at entry (``epoch_next``) and writes it back at exit (``epoch_commit``). Because
every rank runs the same sequence of launches, matching programs on different ranks hold the same
epoch.

Ordering contract (system scope, so across GPUs over NVLink and towards the host):

* ``signal(flags, v)`` first runs a CTA barrier, then store-releases ``v``. Every write that *any
  thread of this program* made before the call is visible to a reader that observes ``v`` (or a
  later value) through ``wait``. Writes made after the call are not covered.
* ``wait(flags, expected, ...)`` returns once every flag ``f`` in the block has ``f >= expected``,
  read with acquire loads, and then runs a CTA barrier: afterwards every thread of the program sees
  all writes that the signallers published before their matching ``signal``.
* ``signal_add(flag, inc)`` is ``signal`` as an atomic add (for counters shared by many writers).
* ``signal_relaxed`` / ``wait_relaxed`` give no ordering: use them for flags that carry no data
  dependency (or that are followed by an explicit fence).
* Waits are bounded. ``timeout`` is in nanoseconds of wall-clock time (``ordering.clock_ns``: the
  GPU's ``%globaltimer``, the host's clock in the interpreter); ``timeout <= 0`` waits forever.
  When it expires the wait records (rank, peer, slot, expected, seen) in ``diag`` and returns
  without the guarantee above; the host turns the record into an exception. A wait that finds the
  record already claimed returns at once too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .diag import already_failed, record_timeout
from .memory import heap_ptr
from .ordering import (
    clock_ns,
    ld_acquire,
    ld_acquire_first_warp,
    ld_volatile,
    st_relaxed,
    st_release,
    st_release_first_warp,
)

__all__ = [
    "epoch_commit",
    "epoch_commit_slots",
    "epoch_next",
    "program_epoch",
    "signal",
    "signal_add",
    "signal_relaxed",
    "wait",
    "wait_relaxed",
]

#: How many spins between looks at the shared diagnostic record (another wait may have failed).
_CHECK_EVERY = tl.constexpr(1024)
#: How many spins between reads of the global timer in a bounded wait: the read sits on the spin
#: loop's critical path, and a wait's bound needs only a coarse clock.
_CLOCK_EVERY = tl.constexpr(8)


@triton.jit
def epoch_next(epoch_ptr):
    """This launch's epoch for the program that owns ``epoch_ptr`` (uint32; never 0)."""
    e = tl.load(epoch_ptr).to(tl.uint32) + 1
    return tl.where(e == 0, 1, e).to(tl.uint32)


@triton.jit
def program_epoch(bases, rank, epochs_off):
    """``(epoch_ptr, epoch)`` for the calling program: its counter in the epochs table at heap offset
    ``epochs_off`` of this rank, and this launch's epoch (``epoch_next``)."""
    epoch_ptr = heap_ptr(bases, rank, epochs_off, tl.uint32) + tl.program_id(0)
    return epoch_ptr, epoch_next(epoch_ptr)


@triton.jit
def epoch_commit(epoch_ptr, epoch):
    """Store the epoch back so that the next launch (or graph replay) continues from it."""
    tl.store(epoch_ptr, tl.cast(epoch, tl.uint32))


@triton.jit
def epoch_commit_slots(epoch_ptr, epoch, slots):
    """``epoch_commit`` for a launch narrower than its channel: the calling program (``epoch_ptr``
    from ``program_epoch``) also stores the epoch for programs ``pid + grid, pid + 2 * grid, ...``
    below ``slots``, the ones a launch of ``grid`` programs leaves out, so that every program of a
    later launch of up to ``slots`` programs starts from the same epoch. Needs every slot at the same
    epoch before the launch (every launch on the channel commits this way or covers all slots).
    Plain stores, as ``epoch_commit``: ordered for the next launch on the stream by the kernel
    boundary, not for any reader of this launch (no other program reads these slots during it)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    for slot in range(pid, slots, grid):
        tl.store(epoch_ptr + (slot - pid), tl.cast(epoch, tl.uint32))


@triton.jit
def signal(flags, value, FIRST_WARP: tl.constexpr = False):
    """Publish this program's prior writes and set ``flags`` (one or a block) to ``value``. With
    ``FIRST_WARP`` only the program's first warp stores (after the CTA barrier, its release covers
    every thread's writes): for 1-D blocks of at most 32 lanes made from ``tl.arange``, whose lanes
    all live in the first warp."""
    tl.debug_barrier()
    if FIRST_WARP:
        tl.static_assert(flags.numel <= 32, "signal: FIRST_WARP takes blocks of at most 32 lanes")
        st_release_first_warp(flags, value)
    else:
        st_release(flags, value)


@triton.jit
def signal_relaxed(flags, value):
    """Set ``flags`` to ``value`` with no ordering guarantee."""
    st_relaxed(flags, value)


@triton.jit
def signal_add(flag, inc):
    """Publish this program's prior writes and atomically add ``inc`` to ``flag``."""
    tl.debug_barrier()
    tl.atomic_add(flag, tl.cast(inc, tl.uint32), sem="release", scope="sys")


@triton.jit
def _behind(seen, expected):
    return (seen - expected).to(tl.int32, bitcast=True) < 0


@triton.jit
def _expired(t0, spins, timeout):
    """Whether a wait that started at ``t0`` (``clock_ns``) has run past ``timeout`` ns; the
    timer is read every ``_CLOCK_EVERY`` spins only (in both worlds: wall-clock time)."""
    expired = False
    if (spins % _CLOCK_EVERY) == 0:
        expired = (clock_ns() - t0).to(tl.int64) > timeout
    return expired


@triton.jit
def stop_waiting(t0, spins, timeout, diag):
    """What every bounded spin asks after ``spins`` spins since ``t0``: ``(another wait of this
    communicator has already failed, this wait's bound has passed)``. The record is looked at every
    ``_CHECK_EVERY`` spins only; ``timeout <= 0`` never expires."""
    failed = False
    if (spins % _CHECK_EVERY) == 0:
        if already_failed(diag):
            failed = True
    expired = False
    if timeout > 0:
        expired = _expired(t0, spins, timeout)
    return failed, expired


@triton.jit
def _look(flags, expected, ACQUIRE: tl.constexpr, FIRST_WARP: tl.constexpr = False):
    """How many of ``flags`` are behind ``expected``: acquire loads (from the first warp only with
    ``FIRST_WARP``; the other warps then see none behind and wait at the caller's CTA barrier) or
    volatile ones."""
    if ACQUIRE:
        if FIRST_WARP:
            tl.static_assert(flags.numel <= 32, "wait: FIRST_WARP takes blocks of at most 32 lanes")
            seen = ld_acquire_first_warp(flags, expected)
        else:
            seen = ld_acquire(flags)
    else:
        seen = ld_volatile(flags)
    return tl.sum(_behind(seen, expected).to(tl.int32), axis=0)


@triton.jit
def _spin(flags, expected, peers, slot, rank, timeout, diag, ACQUIRE: tl.constexpr, FIRST_WARP: tl.constexpr):
    pending = _look(flags, expected, ACQUIRE, FIRST_WARP)
    if pending > 0:
        t0 = clock_ns()
        spins = 0
        while pending > 0:
            pending = _look(flags, expected, ACQUIRE, FIRST_WARP)
            spins += 1
            if pending > 0:
                failed, expired = stop_waiting(t0, spins, timeout, diag)
                if failed:
                    pending = 0
                if expired:
                    seen = ld_volatile(flags)
                    late = _behind(seen, expected)
                    peer = tl.min(tl.where(late, peers, 1 << 30), axis=0)
                    pick = late & (peers == peer)
                    exp_b = (expected + tl.zeros_like(seen)).to(tl.int64)
                    record_timeout(diag, 1, rank, peer, slot,
                                   tl.max(tl.where(pick, exp_b, -1), axis=0),
                                   tl.max(tl.where(pick, seen.to(tl.int64), -1), axis=0), spins)
                    pending = 0


@triton.jit
def _wait(flags, expected, peers, slot, rank, timeout, diag, ACQUIRE: tl.constexpr, FIRST_WARP: tl.constexpr = False):
    if len(flags.shape) == 0:  # one flag: make it a block of one
        flags = flags + tl.zeros([1], tl.int32)
    _spin(flags, tl.cast(expected, tl.uint32), peers + tl.zeros(flags.shape, tl.int32), slot, rank, timeout, diag,
          ACQUIRE, FIRST_WARP)


@triton.jit
def wait(flags, expected, peers, slot, rank, timeout, diag, FIRST_WARP: tl.constexpr = False):
    """Wait until every flag in ``flags`` (one pointer or a block) reaches ``expected`` (acquire;
    see the module docstring).

    ``peers`` (an int, or a block like ``flags``) and ``slot`` only name the flags in a diagnostic.
    ``rank`` is this rank, ``timeout`` the bound, ``diag`` the communicator's record (int64 pointer).
    With ``FIRST_WARP`` only the program's first warp polls (the others wait at the closing CTA
    barrier): for 1-D blocks of at most 32 lanes made from ``tl.arange``, as ``signal``'s.
    """
    _wait(flags, expected, peers, slot, rank, timeout, diag, True, FIRST_WARP)
    tl.debug_barrier()


@triton.jit
def wait_relaxed(flags, expected, peers, slot, rank, timeout, diag):
    """``wait`` without acquire ordering (volatile loads) and without the closing CTA barrier."""
    _wait(flags, expected, peers, slot, rank, timeout, diag, False)
