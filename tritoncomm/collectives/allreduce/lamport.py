"""Lamport one-shot all-reduce: the data is its own flag (``kernels.lamport``), and what the Lamport
all-reduces share (the two-shot: ``lamport_twoshot``).

**One-shot** (``lamport_oneshot_kernel``). Every rank stores its input into slot [my rank] of every
peer's buffer, then polls the W-1 other slots of its own buffer until no element holds the sentinel,
sums ranks 0..W-1 in that order in fp32 (its own share read from ``x``), writes the result and resets
what it read. One NVLink trip, full 16-byte stores, no barrier, no flag words.

**Values.** Every rank's input goes through ``lamport_canonical`` (its own share too) before it is
summed: -0.0 comes out as +0.0 (and, in fp32, the sentinel's subnormal as -0.0). Everything else is
summed exactly as the other algorithms sum it.

**Buffer reuse.** Buffers alternate by launch parity. A peer can be at most one launch ahead of this
rank: it finishes launch k only once it has this rank's data of launch k. So while this rank reads and
resets its parity-k buffers, a fast peer writes only into the other parity; it comes back to these in
launch k+2, after this rank's launch k+1 has started, i.e. after launch k (every reset included) ended.
Every element written in a launch is read and reset by its reader in that launch, so between launches
every buffer is at rest, whatever sizes, dtypes and launch shapes the calls use.

**Call check.** Each program sends the call's signature to the same program of every peer as a header
word (``lamport_send_signature``) and compares theirs while it sums (``lamport_sum_ranks``).

Layout in every rank's heap: ``[2][W][slot_bytes]``, then the headers ``[2][W][grid]``.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...kernels import (
    KIND_SIGNATURE,
    assume_multiple,
    epoch_commit,
    epoch_next,
    heap_ptr,
    lamport_canonical,
    lamport_header_reset,
    lamport_header_store,
    lamport_header_try,
    lamport_poll,
    lamport_poll_checked,
    lamport_reset,
    lamport_store,
    lamport_try,
    next_pow2,
    pdl_launch_dependents,
    pdl_wait,
    pow2_divisor,
    record_timeout,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm

__all__ = ["LAMPORT_MAX_PROGRAMS", "LAMPORT_TRIES", "LamportAlgorithm", "LamportOneShot", "lamport_oneshot_kernel",
           "lamport_send_signature", "lamport_sum_ranks", "lamport_wait_rows", "one_block_shapes"]

#: Rounds of back-to-back looks at every peer's slot before ``lamport_sum_ranks`` falls back to one
#: bounded poll per peer.
LAMPORT_TRIES = 4


@triton.jit
def lamport_send_signature(bases, rank, hdr_off, parity, pid, G, sig, WORLD: tl.constexpr):
    """The call check's send side (``lamport_sum_ranks`` reads it): ``sig`` into word ``[parity][rank][pid]``
    of every peer's header area at ``hdr_off`` (``[2][W][G]`` int64 words, ``G`` the grid). Plain stores,
    ordered with nothing (``kernels.lamport``, "Headers")."""
    for p in tl.static_range(WORLD):
        if p != rank:
            lamport_header_store(heap_ptr(bases, p, hdr_off + ((parity * WORLD + rank) * G + pid) * 8, tl.int64), sig)


@triton.jit
def lamport_sum_ranks(own, slots, slot_elems, offs, mask, rank, slot, timeout, diag, WORLD: tl.constexpr,
                      TRIES: tl.constexpr = LAMPORT_TRIES, hdrs=None, hstride=0, check=False, sig=None):
    """``(acc, same)``: the fp32 sum over ranks 0..W-1, in that order, of one block: this rank's values
    are ``own`` (already canonical), rank ``s``'s are at ``slots + s * slot_elems + offs`` of this
    rank's buffer. Up to ``TRIES`` rounds each look once at every peer's slot (loads in flight
    together) and sum; the first round that finds nothing missing is the answer. Only if none does: a
    bounded poll per peer in rank order (a timeout names the peer and ``slot``), then the sum. The
    same additions in the same order either way. Resets the peers' slots it read.

    The call check (with ``sig``, where ``check``): rank ``s``'s header for this program is at ``hdrs +
    s * hstride`` (``kernels.lamport``, "Headers"); it is looked at with the data (the same rounds,
    every thread's look counted; in the polls, ``lamport_poll_checked``) and reset. ``same`` is False
    when a peer's signature differs (recorded as ``KIND_SIGNATURE``) or never came: then nothing else
    is waited for, nothing is reset, and ``acc`` means nothing. Without ``sig`` (or ``check``) ``same`` is True."""
    acc = tl.zeros(own.shape, dtype=tl.float32)
    missing = tl.full([], 1, tl.int32)
    CHECK: tl.constexpr = sig is not None
    differ = tl.full([], 0, tl.int32)  # per thread: the peer + 1 whose header differs (its last look)
    theirs = tl.full([], 0, tl.int64)
    for _t in tl.static_range(TRIES):
        if missing > 0:
            acc = tl.zeros(own.shape, dtype=tl.float32)
            bad = tl.zeros(own.shape, dtype=tl.int32)
            if CHECK:
                differ = tl.full([], 0, tl.int32)
                for s in tl.static_range(WORLD):  # every thread's own look, counted in ``bad``
                    h, hm = lamport_header_try(hdrs + s * hstride, check & (s != rank))
                    bad += hm
                    wrong = (hm == 0) & (h != sig) & check & (s != rank) & (differ == 0)
                    differ = tl.where(wrong, s + 1, differ)
                    theirs = tl.where(wrong, h, theirs)
            for s in tl.static_range(WORLD):  # branch-free: my own slot's load is masked off
                v, m = lamport_try(slots + s * slot_elems + offs, mask & (s != rank))
                bad += m
                acc += tl.where(s == rank, own, v).to(tl.float32)
            missing = tl.sum(bad, axis=0)
            if CHECK:
                if missing > 0:  # a look with a header still missing says nothing about the others
                    differ = tl.full([], 0, tl.int32)
    if missing > 0:
        acc = tl.zeros(own.shape, dtype=tl.float32)
        if CHECK:  # each peer's data and header in the same looks; a differing header ends the wait
            differ = tl.full([], 0, tl.int32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    acc += own.to(tl.float32)
                else:
                    go = differ == 0  # after a differing header, the later peers are not waited for
                    v, h = lamport_poll_checked(slots + s * slot_elems + offs, mask & go, hdrs + s * hstride,
                                                check & go, sig, s, slot, rank, timeout, diag)
                    wrong = (h != sig) & check & go  # 0: never came (the poll gave up): no output either
                    differ = tl.where(wrong, s + 1, differ)
                    theirs = tl.where(wrong, h, theirs)
                    acc += v.to(tl.float32)
            differ = tl.max(tl.zeros(own.shape, tl.int32) + differ, axis=0)  # the same decision in every thread
        else:
            for s in tl.static_range(WORLD):
                if s == rank:
                    acc += own.to(tl.float32)
                else:
                    acc += lamport_poll(slots + s * slot_elems + offs, mask, s, slot, rank, timeout,
                                        diag).to(tl.float32)
    same = differ == 0
    if CHECK:
        if not same:
            if theirs != 0:  # 0: the wait gave up (recorded elsewhere)
                record_timeout(diag, KIND_SIGNATURE, rank, differ - 1, slot, sig, theirs, 0)
    if same:
        for s in tl.static_range(WORLD):  # each element in one thread (the launch shapes' rule): no barrier
            lamport_reset(slots + s * slot_elems + offs, mask & (s != rank), SYNC=False)
        if CHECK:
            tl.debug_barrier()  # every thread's last look at the headers is made
            for s in tl.static_range(WORLD):
                lamport_header_reset(hdrs + s * hstride, check & (s != rank))
    return acc, same


@triton.jit
def lamport_wait_rows(src, mask, rank, slot, timeout, diag, WORLD: tl.constexpr, TRIES: tl.constexpr = LAMPORT_TRIES):
    """The values of a ``[W2, B]`` tile of Lamport elements whose row ``s`` comes from rank ``s``
    (where ``mask``): up to ``TRIES`` looks at the whole tile, then, only if elements are still
    missing, one bounded poll of the tile (a timeout names the lowest late peer and ``slot``). Does
    not reset."""
    W2: tl.constexpr = src.shape[0]
    missing = tl.full([], 1, tl.int32)
    v = tl.zeros(src.shape, dtype=src.dtype.element_ty)
    for _t in tl.static_range(TRIES):
        if missing > 0:
            v, miss = lamport_try(src, mask)
            missing = tl.sum(tl.sum(miss, axis=1), axis=0)
    if missing > 0:  # a bounded poll of the whole tile; a timeout names the lowest late peer
        v = lamport_poll(src, mask, tl.arange(0, W2)[:, None], slot, rank, timeout, diag)
    return v


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def lamport_oneshot_kernel(x_ptr, out_ptr, n, bases, rank, timeout, diag_addr, epochs_off, buf_off, slot_bytes,
                           active, hdr_off, sig, WORLD: tl.constexpr, BLOCK: tl.constexpr, NDIV: tl.constexpr = 1,
                           TRIES: tl.constexpr = LAMPORT_TRIES, EARLY: tl.constexpr = False):
    """Sum ``n`` elements of ``x_ptr`` over the ranks into ``out_ptr`` (may equal ``x_ptr``); buffers of
    ``slot_bytes`` (a multiple of 256) per (parity, source). Programs ``>= active`` only keep their
    epoch in step with the others. A program with one block keeps it in registers between the push
    and the sum. ``EARLY``: let the next PDL kernel start right away instead of after the pushes.
    ``sig``: the call's signature; each active program sends it to every peer as a header (at
    ``hdr_off``: ``[2][W][grid]`` int64 words) and compares theirs with its first block's data: where
    one differs, the program writes nothing (None: no check)."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = address_ptr(diag_addr, tl.int64)
    W2: tl.constexpr = next_pow2(WORLD)
    k = tl.arange(0, W2)
    peer_bases = tl.load(bases + tl.where(k < WORLD, k, rank))  # set once at start-up: safe before the wait
    my_base = tl.sum(tl.where(k == rank, peer_bases, 0), axis=0)
    pdl_wait()  # launched with PDL: the previous kernel has ended
    if EARLY:
        pdl_launch_dependents()
    epoch_ptr = (my_base + epochs_off).to(tl.pointer_type(tl.uint32)) + pid  # program_epoch, its base preloaded
    e = epoch_next(epoch_ptr)
    parity = (e & 1).to(tl.int64)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(n, BLOCK) - pid, active)
        slot_elems = slot_bytes // ESIZE
        mine = tl.multiple_of((my_base + buf_off + parity * WORLD * slot_bytes).to(tl.pointer_type(DTYPE)), 16)
        G = tl.num_programs(0)
        hdrs = (my_base + hdr_off + (parity * WORLD * G + pid) * 8).to(tl.pointer_type(tl.int64))  # mine, from s
        if sig is not None:
            if iters > 0:  # a program with no block reads no header: it sends none
                for p in tl.static_range(WORLD):  # my header into every peer's (parity, my rank, pid) word
                    if p != rank:
                        base = tl.sum(tl.where(k == p, peer_bases, 0), axis=0)
                        lamport_header_store((base + hdr_off + ((parity * WORLD + rank) * G + pid) * 8).to(
                            tl.pointer_type(tl.int64)), sig)
        if iters == 1:  # one block: push it, then sum it from registers
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            v = tl.load(x_ptr + offs, mask=m, other=0.0)
            slot = buf_off + (parity * WORLD + rank) * slot_bytes
            for p in tl.static_range(WORLD):
                if p != rank:
                    base = tl.sum(tl.where(k == p, peer_bases, 0), axis=0)
                    dst = tl.multiple_of((base + slot).to(tl.pointer_type(DTYPE)), 16)
                    lamport_store(dst + offs, v, mask=m)
            pdl_launch_dependents()
            acc, same = lamport_sum_ranks(lamport_canonical(v), mine, slot_elems, offs, m, rank, pid, timeout, diag,
                                          WORLD, TRIES, hdrs, G, True, sig)
            if same:
                tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=m)
        else:
            for i in range(0, iters):  # 1. my input into slot [rank] of every peer's buffer
                offs = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
                m = offs < n
                v = tl.load(x_ptr + offs, mask=m)
                for p in tl.static_range(WORLD):
                    if p != rank:
                        dst = heap_ptr(bases, p, buf_off + (parity * WORLD + rank) * slot_bytes, DTYPE)
                        lamport_store(dst + offs, v, mask=m)
            pdl_launch_dependents()
            ok = tl.full([], 1, tl.int1)
            for i in range(0, iters):  # 2. every rank's block from my buffer, summed in rank order
                if ok:
                    b = pid + i * active
                    offs = b * BLOCK + tl.arange(0, BLOCK)
                    m = offs < n
                    own = lamport_canonical(tl.load(x_ptr + offs, mask=m, other=0.0))
                    acc, same = lamport_sum_ranks(own, mine, slot_elems, offs, m, rank, b, timeout, diag, WORLD,
                                                  TRIES, hdrs, G, i == 0, sig)
                    ok = same
                    if same:
                        tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=m)
    epoch_commit(epoch_ptr, e)


#: Most programs of a Lamport launch: one-warp programs, one block each, up to this many (all resident
#: on an H200: 132 SMs x 32 blocks).
LAMPORT_MAX_PROGRAMS = 2048


def one_block_shapes(algo: str, elems: int) -> list[Choice]:
    """Launch shapes that give every program one block of ``elems`` (or two), with blocks of one
    16-byte vector (or a few) per thread: what measured fastest at every size (``docs/algorithms.md``)."""
    out = set()
    for block, warps in ((256, 1), (512, 1), (512, 2), (1024, 2), (2048, 4)):
        need = cdiv(elems, block)
        for programs in (need, cdiv(need, 2)):
            out.add(Choice(algo, max(1, min(programs, LAMPORT_MAX_PROGRAMS)), block, warps))
    return sorted(out, key=lambda c: (c.programs, c.block, c.num_warps))


class LamportAlgorithm(AllReduceAlgorithm):
    """What the Lamport launchers (here and in ``lamport_twoshot``) share: buffers put at rest once, at set-up
    (``Workspace.lamport_bytes``); programmatic dependent launch; the kernels' ``TRIES`` and ``EARLY``
    (``tries``, ``early``)."""

    barriers = False

    pdl = True
    tries = LAMPORT_TRIES
    early = False


class LamportOneShot(LamportAlgorithm):
    """Launcher of ``lamport_oneshot_kernel``. Workspace: 2 (parities) x W slots of the capacity."""

    name = "lamport"
    kernel = lamport_oneshot_kernel
    shapes = MappingProxyType({"cuda": (16, 512, 1), "cpu": (2, 1024, 1)})
    #: Each GPU sends ``(W-1) x S``: past a few MB the two-shots move less.
    limit = 4 << 20

    def layout(self) -> Workspace:
        self.slot_bytes = round_up(self.capacity, 256)
        both = 2 * self.world * self.slot_bytes  # the Lamport buffers, then the headers (0 at rest)
        self.hdr_rel = both
        return Workspace(buffer_bytes=both + 2 * self.world * self.grid * 8, lamport_bytes=both)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice("lamport", 2, 1024, 1)] if nbytes <= 256 << 10 else []
        if nbytes > cls.limit:
            return []
        return one_block_shapes("lamport", cdiv(nbytes, 2))

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n = x.numel()
        self.launcher(
            x, out, n, bases, rank, timeout, diag, ch.epochs_off, ch.buffer_off, self.slot_bytes, c.programs,
            ch.buffer_off + self.hdr_rel, sig, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(n), TRIES=self.tries,
            EARLY=self.early, num_warps=c.num_warps,
            **self.launch_opts)
