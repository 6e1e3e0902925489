"""Lamport buffers: the data is its own flag.

A Lamport buffer at rest holds a *sentinel* in every element: the bit pattern ``0x8000`` in every
16-bit half (negative zero for bf16 and fp16). A writer stores real values over it; a reader polls
the values themselves until none is the sentinel, then resets what it read back to the sentinel.
No flag words, no fence, no barrier: one NVLink trip in full 16-byte stores, the whole payload useful
(an LL8 packet is half flag).

The sentinel is one byte pattern for every dtype of 16 bits or more, so a buffer left at rest by a
bf16 call is at rest for an fp32 call too. Per element of ``DTYPE``:

* 16-bit dtypes (bf16, fp16): the sentinel is ``0x8000`` (-0.0). ``lamport_store`` sends -0.0 as
  +0.0, which compares equal.
* 32-bit dtypes (fp32, int32): the sentinel is the word ``0x80008000`` (as fp32 -4.59e-41, a
  negative subnormal; as int32 -2147450880). ``lamport_store`` sends that one value as
  ``0x80000000`` (fp32 -0.0), which is not the sentinel.
* FP8 (e4m3, e5m2): the sentinel is the byte ``0x80`` (-0.0 in both formats), sent as ``0x00``
  (+0.0). A buffer of FP8 elements has its own at-rest pattern: ``lamport_fill`` (given the FP8
  tensor) and ``lamport_reset`` write ``0x80`` in every byte there.

So a value that travels through a Lamport buffer can come out changed only in those ways; the
collectives built on it apply ``lamport_canonical`` to every rank's input (their own share too), so
every rank sums the same values and gets the same bits.

Contract (per element, like ``ll``):

* ``lamport_store(ptrs, vals, mask)``: plain stores of ``lamport_canonical(vals)``; no ordering
  between elements or with other writes. Each element is single-copy atomic (naturally aligned).
* ``lamport_try(ptrs, mask)``: one volatile look: ``(values, 1 per masked element still at the
  sentinel)``. The values are meaningful where the indicator is 0. Issue several tries back to back
  and sum their indicators once: their loads are then in flight together. A sum of 0 vouches for
  every thread's values only if the block has at least one element per thread of the program:
  Triton copies a smaller block across threads, each copy is a look of its own, and a reduction
  counts one copy (another thread's copy can still hold the sentinel).
* ``lamport_poll(ptrs, mask, peer, slot, rank, timeout, diag)``: volatile looks until no masked
  element holds the sentinel; returns the values of the last look where the block has at least one
  element per thread of the program, else of one more look, so any block shape is safe for the
  values. Bounded like ``signals.wait`` (kind 4 in ``diag``: the peer, the slot, the address of
  the first element still missing, and how many were). The threads of a program do not finish a
  poll together: where a block has fewer elements than the program has threads, each copy of an
  element is polled by its own thread, and one warp can be done while another still looks.
* Never wait on two blocks in one loop when one of them is smaller than the program's threads: its
  look is counted per warp (a warp-level reduction), the other's across the program (with CTA
  barriers inside the loop), so warps would leave the loop after different numbers of barriers
  (undefined behaviour: a hang, or a timeout record of garbage values).
* ``lamport_poll_from(v, miss, ptrs, mask, ...)``: ``lamport_poll`` after a first look that the
  caller issued earlier (``lamport_try``), so that its loads overlap other work.
* ``lamport_reset(ptrs, mask, SYNC=True)``: store the sentinel. Only the buffer's reader resets,
  after it has read: a writer may store into an element again only once it knows the reader has
  reset it (the collectives alternate two buffers by launch parity: a peer can be at most one launch
  ahead, and a launch ends only after every reset it made). With ``SYNC`` (the default) every
  thread of the program first arrives at a CTA barrier, so no element is reset before every
  thread's copy of it has been read: without it, a warp that has seen the data and resets it can
  leave another warp polling the sentinel until its time limit. ``SYNC=False`` only where the
  program has made a CTA barrier since its last look, or where every element of the block lies in
  one thread (at least one element per thread: ``selection.Choice`` enforces it for the
  all-reduce shapes). Every thread of the program must reach a synchronising reset.
* ``lamport_fill(t)`` (host): put a whole buffer at rest.

**Headers** (the always-on call check of the Lamport collectives, ``kernels.consistency``): a header
is one int64 word per (parity, source, program), 0 at rest, that carries the call's signature (bit 62
set: never 0). ``lamport_header_store(ptr, sig)``: a plain store by the program's first thread, no
ordering with the data (the reader waits for both). ``lamport_header_try(ptr, keep)``: one volatile
look *by every thread* (each its own): ``(value, 1 if still at rest and keep)``; add the indicator to
the data's per-element indicators before their reduction so that any thread's miss counts.
``lamport_header_poll(ptr, keep, peer, slot, rank, timeout, diag)``: per-thread bounded looks with no
CTA barrier inside (threads may leave at different looks); after a failure elsewhere or its own
timeout it returns 0. ``lamport_poll_checked(ptrs, mask, hdr, keep, sig, ...)``: a peer's data and
header in the same looks (a header waited for on its own adds a load's latency to the call), leaving
early on a header that differs from ``sig``; like ``lamport_poll``, it returns one more look of both
where the data block is smaller than the program's threads. ``lamport_header_reset(ptr, keep)``: back
to 0, by the reader, after a CTA barrier that follows every thread's last look.

Reads of a buffer are only of data that this launch's writers stored; nothing else the writer did is
published by it.

**The CPU world.** The interpreter loads an element with ``memcpy``, and glibc copies two bytes as a
byte load followed by a word load (the byte's value kept): a look that races the element's one store
can return the old low byte with the new high byte, which is not the sentinel, so it would pass for
data. Wider elements are copied with whole loads, and bytes are single. So there, for 16-bit
elements, ``lamport_try`` looks twice and counts an element as missing unless both loads agree (each
element changes once while it is read: sentinel to value); ``lamport_poll`` needs no such care, since
it returns a load made after every element was seen written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import INTERPRET, program_threads
from .diag import KIND_SIGNATURE, record_timeout
from .ordering import clock_ns
from .signals import stop_waiting

__all__ = ["KIND_LAMPORT", "KIND_SIGNATURE", "LAMPORT_SENTINEL8", "LAMPORT_SENTINEL16", "lamport_canonical",
           "lamport_fill", "lamport_header_poll", "lamport_header_reset", "lamport_header_store", "lamport_header_try",
           "lamport_missing", "lamport_poll", "lamport_poll_checked", "lamport_poll_from", "lamport_reset",
           "lamport_store", "lamport_try"]

#: The at-rest pattern of every 16-bit half of a Lamport buffer (of elements of 16 bits or more).
LAMPORT_SENTINEL16 = 0x8000
#: The at-rest pattern of every byte of a Lamport buffer of 8-bit elements.
LAMPORT_SENTINEL8 = 0x80
#: The diagnostic kind a Lamport poll records when it times out.
KIND_LAMPORT = tl.constexpr(4)
#: Above every address: what a search for the lowest address still missing starts from.
_NO_ADDRESS = tl.constexpr(1 << 62)


def lamport_fill(t: torch.Tensor) -> None:
    """Host side: put ``t`` at rest: an FP8 tensor every byte ``0x80``; any other (raw bytes of the
    heap included) every 16-bit half ``0x8000``, so it must hold an even number of bytes."""
    if t.is_floating_point() and t.element_size() == 1:
        t.view(torch.uint8).fill_(LAMPORT_SENTINEL8)
    else:
        t.view(torch.int16).fill_(LAMPORT_SENTINEL16 - (1 << 16))


@triton.jit
def _bits(vals):
    if vals.dtype.primitive_bitwidth == 8:
        return vals.to(tl.uint8, bitcast=True)
    elif vals.dtype.primitive_bitwidth == 16:
        return vals.to(tl.uint16, bitcast=True)
    else:
        return vals.to(tl.uint32, bitcast=True)


@triton.jit
def _sentinel(DTYPE: tl.constexpr):
    if DTYPE.primitive_bitwidth == 8:
        return tl.full([], 0x80, tl.uint8)
    elif DTYPE.primitive_bitwidth == 16:
        return tl.full([], 0x8000, tl.uint16)
    else:
        return tl.full([], 0x80008000, tl.uint32)


@triton.jit
def lamport_missing(vals):
    """1 where an element of ``vals`` (as loaded) is the sentinel, else 0 (int32)."""
    return (_bits(vals) == _sentinel(vals.dtype)).to(tl.int32)


@triton.jit
def lamport_canonical(vals):
    """``vals`` with the one value of its dtype that the sentinel would hide replaced by a value that
    compares equal (8- and 16-bit: -0.0 -> +0.0) or is the nearest non-sentinel (32-bit: the
    sentinel word -> ``0x80000000``)."""
    DTYPE: tl.constexpr = vals.dtype
    bits = _bits(vals)
    if DTYPE.primitive_bitwidth == 8:
        fixed = tl.where(bits == 0x80, 0, bits).to(tl.uint8)
        return fixed.to(DTYPE, bitcast=True)
    elif DTYPE.primitive_bitwidth == 16:
        fixed = tl.where(bits == 0x8000, 0, bits).to(tl.uint16)
        return fixed.to(DTYPE, bitcast=True)
    else:
        fixed = tl.where(bits == 0x80008000, 0x80000000, bits).to(tl.uint32)
        return fixed.to(DTYPE, bitcast=True)


@triton.jit
def lamport_store(ptrs, vals, mask=None):
    """Store ``lamport_canonical(vals)`` at ``ptrs`` (usually in a peer's Lamport buffer)."""
    tl.store(ptrs, lamport_canonical(vals), mask=mask)


@triton.jit
def lamport_try(ptrs, mask):
    """One look at ``ptrs`` (where ``mask``): ``(values, 1 per masked element still missing)``.
    In the interpreter a look at 16-bit elements is two loads, and an element whose loads differ
    counts as missing (module docstring, "The CPU world")."""
    v = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
    missing = lamport_missing(v)
    if INTERPRET and v.dtype.primitive_bitwidth == 16:
        first = _bits(v)
        v = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
        missing = (missing + lamport_missing(v) + (_bits(v) != first).to(tl.int32)) > 0
    return v, missing.to(tl.int32) * mask.to(tl.int32)


@triton.jit
def lamport_reset(ptrs, mask=None, SYNC: tl.constexpr = True):
    """Put the elements at ``ptrs`` back at rest (the reader, after reading them); with ``SYNC``
    after a CTA barrier, so that every thread of the program has made its looks first (module
    docstring)."""
    if SYNC:
        tl.debug_barrier()
    DTYPE: tl.constexpr = ptrs.dtype.element_ty
    if DTYPE.primitive_bitwidth == 8:
        rest = tl.full(ptrs.shape, 0x80, tl.uint8).to(DTYPE, bitcast=True)
    elif DTYPE.primitive_bitwidth == 16:
        rest = tl.full(ptrs.shape, 0x8000, tl.uint16).to(DTYPE, bitcast=True)
    else:
        rest = tl.full(ptrs.shape, 0x80008000, tl.uint32).to(DTYPE, bitcast=True)
    tl.store(ptrs, rest, mask=mask)


@triton.jit
def _total(x):
    """Sum of a 1-D or 2-D block."""
    if len(x.shape) == 2:
        return tl.sum(tl.sum(x, axis=1), axis=0)
    else:
        return tl.sum(x, axis=0)


@triton.jit
def _lowest(x):
    """The least element of a 1-D or 2-D block (a scalar as is)."""
    if len(x.shape) == 2:
        return tl.min(tl.min(x, axis=1), axis=0)
    elif len(x.shape) == 1:
        return tl.min(x, axis=0)
    else:
        return x


@triton.jit
def lamport_poll(ptrs, mask, peer, slot, rank, timeout, diag):
    """Wait until no element at ``ptrs`` (a 1-D or 2-D block, where ``mask``) holds the sentinel;
    return the values. ``peer`` names the writer in a diagnostic: an int, or a block like ``ptrs``
    (the lowest peer with an element still missing is named). Bounded: on timeout it records (rank,
    peer, slot, the address of the lowest element still missing, how many are) and returns what it
    has; the communicator's error names the heap buffer at that address. A block of at least one
    element per thread of the program returns the values of the look that found none missing; a
    smaller one, which Triton copies across threads, those of one more look."""
    v, miss = lamport_try(ptrs, mask)
    return lamport_poll_from(v, miss, ptrs, mask, peer, slot, rank, timeout, diag)


@triton.jit
def lamport_poll_from(v, miss, ptrs, mask, peer, slot, rank, timeout, diag):
    """``lamport_poll`` whose first look, ``v, miss = lamport_try(ptrs, mask)``, the caller made
    earlier: its loads are in flight while the caller does other work (another poll, say). Counting
    ``miss`` is this poll's first wait."""
    missing = _total(miss)
    if missing > 0:
        t0 = clock_ns()
        spins = 0
        while missing > 0:
            v, miss = lamport_try(ptrs, mask)
            missing = _total(miss)
            spins += 1
            if missing > 0:
                failed, expired = stop_waiting(t0, spins, timeout, diag)
                if expired:
                    late = miss > 0
                    first = _lowest(tl.where(late, peer + tl.zeros(ptrs.shape, tl.int32), 1 << 30))
                    addr = _lowest(tl.where(late, ptrs.to(tl.int64), _NO_ADDRESS))
                    record_timeout(diag, KIND_LAMPORT, rank, first, slot, addr, missing.to(tl.int64), spins)
                if failed or expired:
                    missing = 0
    if not INTERPRET and ptrs.numel < program_threads():  # copied across threads: one copy was counted
        v = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
    return v


@triton.jit
def lamport_poll_checked(ptrs, mask, hdr, keep, sig, peer, slot, rank, timeout, diag):
    """``lamport_poll`` of a peer's block together with that peer's header word ``hdr`` (where
    ``keep``): every look loads both, so the header costs no wait of its own. A 2-D block may take a
    header per row (``hdr``, ``keep`` and ``peer`` of shape ``[rows, 1]``). Returns ``(values,
    header)``. It stops once every thread has found the data all there and the header written, or
    the header written with a signature other than ``sig`` (then that row's values mean nothing: a
    different call's data may never come). Bounded as ``lamport_poll`` (kind 4, naming the lowest
    late peer and the lowest address still missing, a header's if only headers are); a header is 0
    if the wait gave up, 1 where not ``keep``. A data block smaller than the program's threads returns
    the values and headers of one more look, as ``lamport_poll``: its reductions count one copy of an
    element, and another thread's copy may still hold the sentinel."""
    v, miss = lamport_try(ptrs, mask)
    h, hm = lamport_header_try(hdr, keep)
    wrong = (hm == 0) & (h != sig) & keep
    missing = _total(tl.where(wrong, 0, miss + hm))
    gave_up = tl.full([], 0, tl.int1)
    if missing > 0:
        t0 = clock_ns()
        spins = 0
        while missing > 0:
            v, miss = lamport_try(ptrs, mask)
            h, hm = lamport_header_try(hdr, keep)
            wrong = (hm == 0) & (h != sig) & keep
            missing = _total(tl.where(wrong, 0, miss + hm))
            spins += 1
            if missing > 0:
                failed, expired = stop_waiting(t0, spins, timeout, diag)
                if expired:
                    late = (miss + hm > 0) & (wrong == 0)
                    who = _lowest(tl.where(late, peer + tl.zeros(ptrs.shape, tl.int32), 1 << 30))
                    addr = _lowest(tl.where(miss > 0, ptrs.to(tl.int64), _NO_ADDRESS))
                    at_hdr = _lowest(tl.where((hm > 0) & (wrong == 0), hdr.to(tl.int64), _NO_ADDRESS))
                    addr = tl.where(addr == _NO_ADDRESS, at_hdr, addr)
                    record_timeout(diag, KIND_LAMPORT, rank, who, slot, addr, missing.to(tl.int64), spins)
                if failed or expired:
                    missing = 0
                    gave_up = tl.full([], 1, tl.int1)
    if not INTERPRET and ptrs.numel < program_threads():  # copied across threads: one copy was counted
        tl.debug_barrier()  # after the look that was counted, whichever thread made it
        v = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
        h = tl.load(hdr, mask=keep, other=1, volatile=True)
    if gave_up:
        h = tl.where(keep, 0, h)
    return v, h


@triton.jit
def lamport_header_store(ptr, sig):
    """Store the call's signature ``sig`` (int64, never 0) into a peer's header word ``ptr``."""
    tl.store(ptr, tl.cast(sig, tl.int64))


@triton.jit
def lamport_header_try(ptr, keep):
    """One look at the header word ``ptr`` where ``keep`` (every thread its own): ``(value, 1 if it is
    still at rest, else 0)``; ``(1, 0)`` where not ``keep``."""
    h = tl.load(ptr, mask=keep, other=1, volatile=True)
    return h, ((h == 0) & keep).to(tl.int32)


@triton.jit
def lamport_header_poll(ptr, keep, peer, slot, rank, timeout, diag):
    """Looks at the header word ``ptr`` (where ``keep``) until it is written; bounded like
    ``lamport_poll`` (kind 4, the header's address). Per thread, no CTA barrier inside. Returns the
    word: 0 if the wait gave up (its own bound, or a failure recorded elsewhere), 1 where not ``keep``."""
    h, miss = lamport_header_try(ptr, keep)
    if miss > 0:
        t0 = clock_ns()
        spins = 0
        while miss > 0:
            h, miss = lamport_header_try(ptr, keep)
            spins += 1
            if miss > 0:
                failed, expired = stop_waiting(t0, spins, timeout, diag)
                if expired:
                    record_timeout(diag, KIND_LAMPORT, rank, peer, slot, ptr.to(tl.int64), 1, spins)
                if failed or expired:
                    miss = 0
    return h


@triton.jit
def lamport_header_reset(ptr, keep):
    """Put the header word ``ptr`` back at rest (0) where ``keep``: the reader, after a CTA barrier that
    follows every thread's last look."""
    tl.store(ptr, tl.zeros([], tl.int64), mask=keep)
