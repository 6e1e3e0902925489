"""The one-kernel dispatch's call check with packets (``onekernel``, module docstring, "Call check"):
every program sends the call's signature to the same program of every peer as a header word
(``kernels.lamport``, "Headers") before its routing copy, and compares theirs before it lays out
anything the peers sent."""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import KIND_SIGNATURE, lamport_header_poll, lamport_header_reset, record_timeout

__all__ = ["header_look", "headers_match"]


@triton.jit
def header_look(hdrs, rank, WORLD: tl.constexpr, BLOCK_W: tl.constexpr):
    """One look at every peer's header word (``hdrs + s``), issued early so that its loads travel
    with other waits (``headers_match`` takes it): 0 where a header is not there yet, 1 for this
    rank and past the world."""
    ws = tl.arange(0, BLOCK_W)
    return tl.load(hdrs + ws, mask=(ws != rank) & (ws < WORLD), other=1, volatile=True)


@triton.jit
def headers_match(hdrs, seen, sig, pid, rank, timeout, diag, WORLD: tl.constexpr, BLOCK_W: tl.constexpr):
    """Whether every peer's header word (``hdrs + s``, ``kernels.lamport``, "Headers") holds ``sig``.
    ``seen``: an earlier look (``header_look``); only if a header was missing there does every
    thread poll each (bounded). The first that differs is recorded as ``KIND_SIGNATURE`` (slot: the
    program), and after a CTA barrier the words are back at rest. False too where a header never came
    (the poll recorded the timeout, or a failure elsewhere stopped it)."""
    ws = tl.arange(0, BLOCK_W)
    peer = (ws != rank) & (ws < WORLD)
    MISSING: tl.constexpr = 1 << 20
    code = tl.max(tl.where(peer & (seen == 0), MISSING, tl.where(peer & (seen != sig), ws + 1, 0)), axis=0)
    differ = code  # the peer + 1 whose header differs (0: none), the same in every thread
    theirs = tl.full([], 0, tl.int64)
    if code > 0:  # a difference or a miss (rare): the differing value, from the thread that holds it
        theirs = tl.max(tl.where(ws + 1 == code, seen, 0), axis=0)
    if code >= MISSING:  # a header was not there yet: every thread polls them all
        differ = tl.full([], 0, tl.int32)
        theirs = tl.full([], 0, tl.int64)
        for s in tl.static_range(WORLD):
            if s != rank:
                h = lamport_header_poll(hdrs + s, s != rank, s, pid, rank, timeout, diag)
                wrong = (h != sig) & (differ == 0)
                differ = tl.where(wrong, s + 1, differ)
                theirs = tl.where(wrong, h, theirs)
        differ = tl.max(tl.zeros([BLOCK_W], tl.int32) + differ, axis=0)  # the same decision in every thread
        theirs = tl.max(tl.zeros([BLOCK_W], tl.int64) + theirs, axis=0)
    if differ > 0:
        if theirs != 0:  # 0: the poll gave up (recorded there)
            record_timeout(diag, KIND_SIGNATURE, rank, differ - 1, pid, sig, theirs, 0)
    tl.debug_barrier()  # every thread's last look is made
    for s in tl.static_range(WORLD):
        if s != rank:
            lamport_header_reset(hdrs + s, s != rank)
    return differ == 0
