"""LL8 packets: 4 bytes of data and a 4-byte flag written by one 8-byte store.

Because the packet is a single naturally aligned 8-byte store, a reader that sees the expected flag
in a packet also sees that packet's data: no fence, no separate signal, one trip over NVLink. The
price is half the link's bandwidth, so LL suits small messages.

Contract:

* ``ll8_store(ptrs, words, flag)``: plain stores of packets ``(flag << 32) | word``. Each packet is
  single-copy atomic; there is no ordering between packets or with other writes.
* ``ll8_try(ptrs, mask, flag)``: one volatile load of the packets, no wait: returns their data words
  and, per packet, 1 where a masked packet does not carry ``flag`` yet (else 0). The words are
  meaningful only where the flag matched, so all of them once the indicators sum to 0, if the block
  has at least one packet per thread (``kernels.lamport``, ``lamport_try``, says why). Nothing is
  reduced across threads, so tries of several peers' packets issued back to back are all in flight
  together (sum their indicators once, after the last), where each ``ll8_poll`` waits for its own
  answer.
* ``ll8_poll(ptrs, mask, flag, ...)``: volatile loads until every masked packet carries ``flag``;
  returns their data words: from the first look if it found them all (so, as for ``ll8_try``, the
  block needs at least one packet per thread), else from one more look. Only the polled packets'
  data is guaranteed, nothing else the writer did. Use a fresh flag value per use of a buffer (an
  epoch), so a stale packet never matches; a buffer may be rewritten only once every reader is
  known to be done with it (for example by alternating two buffers by epoch parity). Bounded like
  ``signals.wait`` (kind 2 in ``diag``).
* ``ll8_poll_sum_f32(ptrs, mask, flag, ...)``: the same wait for packets whose data words are fp32
  values; returns their sum (``tl.sum`` over the block: the same order in every program and rank
  that polls a block of the same shape), taken from the very look that found every packet, so
  there is no reload after a spin. For small exchanges between programs (partial sums).
* Signature headers (the always-on call check of the LL collectives, ``kernels.consistency``): a
  call's int64 signature as two packets (low word, high word) flagged with the launch's epoch.
  ``ll8_sig_store(ptr, sig, flag)``: two packet stores by the program's first thread.
  ``ll8_sig_try(ptr, keep, flag)``: one look *by every thread* (each its own): ``(signature, 1 if
  either packet lacks the flag and keep)``; add the indicator to the data's before their reduction.
  ``ll8_sig_poll(ptr, keep, flag, ...)``: per-thread bounded looks, no CTA barrier inside; 0 if the
  wait gave up. Epochs make stale headers miss, so nothing is reset.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .diag import record_timeout
from .numerics import pairwise_sum
from .ordering import clock_ns
from .signals import stop_waiting

__all__ = ["ll8_pack", "ll8_poll", "ll8_poll_sum_f32", "ll8_sig_poll", "ll8_sig_store", "ll8_sig_try", "ll8_store",
           "ll8_try", "ll8_unpack"]


@triton.jit
def ll8_pack(words, flag):
    """Packets (uint64) from 32-bit data words and a flag."""
    return (tl.cast(flag, tl.uint64) << 32) | tl.cast(words, tl.uint32).to(tl.uint64)


@triton.jit
def ll8_unpack(packets):
    """(data word, flag) of packets."""
    return (packets & 0xFFFFFFFF).to(tl.uint32), (packets >> 32).to(tl.uint32)


@triton.jit
def ll8_store(ptrs, words, flag, mask=None):
    """Write packets ``(flag, word)`` to ``ptrs`` (uint64 pointers, usually in a peer's heap)."""
    tl.store(ptrs, ll8_pack(words, flag), mask=mask)


@triton.jit
def _missing(ptrs, mask, flag):
    pk = tl.load(ptrs, mask=mask, volatile=True)
    return tl.sum((((pk >> 32).to(tl.uint32) != flag) & mask).to(tl.int32), axis=0)


@triton.jit
def ll8_try(ptrs, mask, flag):
    """One look at the packets at ``ptrs`` (where ``mask``): ``(data words, 1 per packet still
    missing)``, both shaped like ``ptrs``."""
    pk = tl.load(ptrs, mask=mask, volatile=True)
    missing = (((pk >> 32).to(tl.uint32) != tl.cast(flag, tl.uint32)) & mask).to(tl.int32)
    return (pk & 0xFFFFFFFF).to(tl.uint32), missing


@triton.jit
def _give_up(ptrs, mask, flag, t0, spins, peer, slot, rank, timeout, diag):
    """Whether a poll that has spun ``spins`` times since ``t0`` stops (``signals.stop_waiting``); an
    expired bound is recorded (kind 2: the peer, the slot, the expected flag and the first stale flag
    seen)."""
    failed, expired = stop_waiting(t0, spins, timeout, diag)
    if expired:
        seen = tl.load(ptrs, mask=mask, volatile=True)
        bad = (((seen >> 32).to(tl.uint32) != flag) & mask)
        first = tl.max(tl.where(bad, (seen >> 32).to(tl.int64), -1), axis=0)
        record_timeout(diag, 2, rank, peer, slot, flag.to(tl.int64), first, spins)
    return failed or expired


@triton.jit
def ll8_poll(ptrs, mask, flag, peer, slot, rank, timeout, diag):
    """Wait for packets with ``flag`` at ``ptrs`` (where ``mask``); return their data words."""
    flag = tl.cast(flag, tl.uint32)
    pk = tl.load(ptrs, mask=mask, volatile=True)
    missing = tl.sum((((pk >> 32).to(tl.uint32) != flag) & mask).to(tl.int32), axis=0)
    if missing > 0:
        t0 = clock_ns()
        spins = 0
        while missing > 0:
            missing = _missing(ptrs, mask, flag)
            spins += 1
            if missing > 0:
                if _give_up(ptrs, mask, flag, t0, spins, peer, slot, rank, timeout, diag):
                    missing = 0
        pk = tl.load(ptrs, mask=mask, volatile=True)
    return (pk & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _look_sum_f32(ptrs, mask, flag, TREE: tl.constexpr):
    pk = tl.load(ptrs, mask=mask, volatile=True)
    missing = tl.sum((((pk >> 32).to(tl.uint32) != flag) & mask).to(tl.int32), axis=0)
    vals = tl.where(mask, (pk & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True), 0.0)
    if TREE:
        total = pairwise_sum(vals)
    else:
        total = tl.sum(vals, axis=0)
    return missing, total


@triton.jit
def ll8_poll_sum_f32(ptrs, mask, flag, peer, slot, rank, timeout, diag, TREE: tl.constexpr = False):
    """Wait for packets with ``flag`` at ``ptrs`` (where ``mask``); return the sum of their data
    words read as fp32, from the look that saw them all (with ``TREE`` a 1-D power-of-two block,
    summed as ``pairwise_sum``: the same bits in any layout)."""
    flag = tl.cast(flag, tl.uint32)
    missing, total = _look_sum_f32(ptrs, mask, flag, TREE)
    if missing > 0:
        t0 = clock_ns()
        spins = 0
        while missing > 0:
            missing, total = _look_sum_f32(ptrs, mask, flag, TREE)
            spins += 1
            if missing > 0:
                if _give_up(ptrs, mask, flag, t0, spins, peer, slot, rank, timeout, diag):
                    missing = 0
    return total


@triton.jit
def ll8_sig_store(ptr, sig, flag):
    """The call's signature ``sig`` (int64) as two packets at ``ptr`` (low word, then high word)."""
    bits = tl.cast(sig, tl.int64).to(tl.uint64, bitcast=True)
    ll8_store(ptr, (bits & 0xFFFFFFFF).to(tl.uint32), flag)
    ll8_store(ptr + 1, (bits >> 32).to(tl.uint32), flag)


@triton.jit
def ll8_sig_try(ptr, keep, flag):
    """One look at the signature packets at ``ptr`` where ``keep`` (every thread its own):
    ``(signature, 1 if either packet lacks flag, else 0)``; ``(0, 0)`` where not ``keep``."""
    lo, mlo = ll8_try(ptr, keep, flag)
    hi, mhi = ll8_try(ptr + 1, keep, flag)
    sig = (lo.to(tl.uint64) | (hi.to(tl.uint64) << 32)).to(tl.int64, bitcast=True)
    return tl.where(keep, sig, 0), ((mlo + mhi) > 0).to(tl.int32)


@triton.jit
def ll8_sig_poll(ptr, keep, flag, peer, slot, rank, timeout, diag):
    """Looks at the signature packets at ``ptr`` (where ``keep``) until both carry ``flag``; bounded
    like ``ll8_poll`` (kind 2). Per thread, no CTA barrier inside. Returns the signature: 0 if the
    wait gave up (its own bound, or a failure recorded elsewhere) or where not ``keep``."""
    sig, miss = ll8_sig_try(ptr, keep, flag)
    if miss > 0:
        t0 = clock_ns()
        spins = 0
        while miss > 0:
            sig, miss = ll8_sig_try(ptr, keep, flag)
            spins += 1
            if miss > 0:
                if _give_up(ptr + tl.arange(0, 2), keep, tl.cast(flag, tl.uint32), t0, spins, peer, slot, rank,
                            timeout, diag):
                    miss = 0
                    sig = tl.zeros([], tl.int64)
    return sig
