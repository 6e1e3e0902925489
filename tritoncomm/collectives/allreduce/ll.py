"""LL one-shot all-reduce: every rank pushes its whole input to every peer as LL8 packets, then
sums what arrives.

One trip over NVLink and no separate signal: a packet's flag (the launch's epoch) says its data is
there. Receive buffers alternate by epoch parity: a rank can be at most one launch ahead of a
peer that is still reading (it cannot finish launch k+1 before that peer has started it), so the
buffer it writes for launch k+1 is never the one the peer reads for launch k.

Layout of the channel buffer in every rank's heap: ``[parity][source rank][word]`` of uint64
packets, ``slot_words`` words per (parity, source).

Data moves as 32-bit words: 16-bit inputs are paired into words (an odd tail is padded), fp32
values are bit-cast. The sum runs in fp32 over ranks 0..W-1 in that order on every rank, so every
rank gets the same bits.
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
    heap_ptr,
    ll8_poll,
    ll8_sig_poll,
    ll8_sig_store,
    ll8_sig_try,
    ll8_store,
    ll8_try,
    pow2_divisor,
    program_epoch,
    record_timeout,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm

__all__ = ["LL", "LL_TRIES", "ll_allreduce_kernel", "ll_send_signature", "ll_sum_ranks", "load_words", "words_to_f32"]

#: Rounds of back-to-back looks at every peer's packets before ``ll_sum_ranks`` falls back to one
#: bounded poll per peer.
LL_TRIES = 4


@triton.jit
def load_words(x_ptr, n, b, BLOCK: tl.constexpr):
    """Block ``b`` of the input as 32-bit words (BLOCK words)."""
    if x_ptr.dtype.element_ty.primitive_bitwidth == 16:
        offs = b * (2 * BLOCK) + tl.arange(0, 2 * BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        lo, hi = tl.split(tl.reshape(v.to(tl.uint16, bitcast=True), [BLOCK, 2]))
        return lo.to(tl.uint32) | (hi.to(tl.uint32) << 16)
    else:
        offs = b * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        return v.to(tl.uint32, bitcast=True)


@triton.jit
def words_to_f32(words, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse of ``load_words``, widened to fp32 (2*BLOCK or BLOCK values)."""
    if DTYPE.primitive_bitwidth == 16:
        lo = (words & 0xFFFF).to(tl.uint16).to(DTYPE, bitcast=True)
        hi = (words >> 16).to(tl.uint16).to(DTYPE, bitcast=True)
        return tl.reshape(tl.join(lo, hi), [2 * BLOCK]).to(tl.float32)
    else:
        return words.to(DTYPE, bitcast=True).to(tl.float32)


@triton.jit
def ll_send_signature(bases, rank, hdr_off, parity, pid, G, sig, e, WORLD: tl.constexpr):
    """The call check's send side (``ll_sum_ranks`` reads it): ``sig`` as two packets flagged ``e`` into
    slot ``[parity][rank][pid]`` of every peer's signature area at ``hdr_off`` (``[2][W][G][2]`` packets,
    ``G`` the grid). Plain stores, ordered with nothing (``kernels.ll``)."""
    for p in tl.static_range(WORLD):
        if p != rank:
            ll8_sig_store(heap_ptr(bases, p, hdr_off + (((parity * WORLD + rank) * G + pid) * 2) * 8, tl.uint64),
                          sig, e)


@triton.jit
def ll_sum_ranks(own, word_idx, wmask, bases, rank, buf_off, parity, slot_words, e, slot, timeout, diag,
                 WORLD: tl.constexpr, BW: tl.constexpr, DTYPE: tl.constexpr, TRIES: tl.constexpr = LL_TRIES,
                 hdrs=None, hstride=0, check=False, sig=None):
    """``(acc, same)``: the fp32 sum over ranks 0..W-1, in that order, of one block of ``BW`` words:
    this rank's are ``own`` (``load_words``), rank ``s``'s the LL8 packets at words ``word_idx`` of slot
    ``[parity][s]`` of the buffer at ``buf_off`` in my heap (``slot_words`` words per slot).

    Up to ``TRIES`` rounds each look once at every peer's packets (``ll8_try``: the W-1 loads are in
    flight together) and sum them in rank order; the first round in which every packet carried the
    epoch ``e`` is the answer. Only if none did: a bounded ``ll8_poll`` per peer in rank order (a
    timeout names the peer and ``slot``), then the sum again. Either way the same additions in the
    same order, so the bits do not depend on which path ran.

    The call check (with ``sig``, where ``check``): rank ``s``'s signature packets for this program are
    at ``hdrs + s * hstride`` (``kernels.ll``, "Signature headers"), looked at in the same rounds as
    the data. ``same`` is False when a peer's differs (recorded as ``KIND_SIGNATURE``) or never came;
    then nothing more is waited for and ``acc`` means nothing. Without ``sig`` ``same`` is True."""
    EPB: tl.constexpr = BW * (32 // DTYPE.primitive_bitwidth)
    CHECK: tl.constexpr = sig is not None
    acc = tl.zeros([EPB], dtype=tl.float32)
    missing = tl.full([], 1, tl.int32)
    differ = tl.full([], 0, tl.int32)  # per thread: the peer + 1 whose signature differs (its last look)
    theirs = tl.full([], 0, tl.int64)
    for _t in tl.static_range(TRIES):
        if missing > 0:
            # branch-free, so that the W-1 loads issue back to back: my own slot's load is masked off
            acc = tl.zeros([EPB], dtype=tl.float32)
            bad = tl.zeros([BW], dtype=tl.int32)
            if CHECK:
                differ = tl.full([], 0, tl.int32)
                for s in tl.static_range(WORLD):  # every thread's own look, counted in ``bad``
                    h, hm = ll8_sig_try(hdrs + s * hstride, check & (s != rank), e)
                    bad += hm
                    wrong = (hm == 0) & (h != sig) & check & (s != rank) & (differ == 0)
                    differ = tl.where(wrong, s + 1, differ)
                    theirs = tl.where(wrong, h, theirs)
            for s in tl.static_range(WORLD):
                src = heap_ptr(bases, rank, buf_off + ((parity * WORLD + s) * slot_words) * 8, tl.uint64)
                words, m = ll8_try(src + word_idx, wmask & (s != rank), e)
                bad += m
                acc += words_to_f32(tl.where(s == rank, own, words), DTYPE, BW)
            missing = tl.sum(bad, axis=0)  # one reduction per round, after every peer's load
            if CHECK:
                if missing > 0:  # a look with a packet still missing says nothing about the others
                    differ = tl.full([], 0, tl.int32)
    if missing > 0:
        if CHECK:
            for s in tl.static_range(WORLD):  # the signatures first: a different call's packets may never come
                h = ll8_sig_poll(hdrs + s * hstride, check & (s != rank), e, s, slot, rank, timeout, diag)
                wrong = (h != sig) & check & (s != rank) & (differ == 0)
                differ = tl.where(wrong, s + 1, differ)
                theirs = tl.where(wrong, h, theirs)
            differ = tl.max(tl.zeros([BW], tl.int32) + differ, axis=0)  # the same decision in every thread
        if differ == 0:
            acc = tl.zeros([EPB], dtype=tl.float32)
            for s in tl.static_range(WORLD):
                if s == rank:
                    acc += words_to_f32(own, DTYPE, BW)
                else:
                    src = heap_ptr(bases, rank, buf_off + ((parity * WORLD + s) * slot_words) * 8, tl.uint64)
                    acc += words_to_f32(ll8_poll(src + word_idx, wmask, e, s, slot, rank, timeout, diag), DTYPE,
                                        BW)
    same = differ == 0
    if CHECK:
        if not same:
            if theirs != 0:  # 0: the wait gave up (recorded elsewhere)
                record_timeout(diag, KIND_SIGNATURE, rank, differ - 1, slot, sig, theirs, 0)
    return acc, same


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def ll_allreduce_kernel(x_ptr, out_ptr, n, nwords, bases, rank, timeout, diag_addr, epochs_off, buf_off,
                        slot_words, active, hdr_off, sig, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                        NDIV: tl.constexpr = 1, WDIV: tl.constexpr = 1):
    """Sum ``n`` elements of ``x_ptr`` over the ranks into ``out_ptr`` (may equal ``x_ptr``).
    Programs ``>= active`` only keep their epoch in step with the others. ``sig``: the call's
    signature; each program with a block sends it to every peer (two packets at ``hdr_off``:
    ``[2][W][grid][2]``) and compares theirs with its first block: where one differs, the program
    writes nothing (None: no check)."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    nwords = assume_multiple(nwords, WDIV)
    nprog = active
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    EPB: tl.constexpr = BLOCK * (32 // DTYPE.primitive_bitwidth)  # elements per block
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    nblocks = tl.cdiv(nwords, BLOCK)
    # programs >= active take no block (else, with more blocks than active programs, they would redo
    # block pid - active's work: the same packets and outputs again)
    iters = tl.where(pid < nprog, tl.cdiv(nblocks - pid, nprog), 0)
    G = tl.num_programs(0)
    if sig is not None:
        if iters > 0:  # a program with no block reads no signature: it sends none
            ll_send_signature(bases, rank, hdr_off, parity, pid, G, sig, e, WORLD)
    # 1. push packets of my blocks to every peer: slot [parity][rank] of its buffer
    dst_off = buf_off + ((parity * WORLD + rank) * slot_words) * 8
    for i in range(0, iters):
        b = pid + i * nprog
        w = b * BLOCK + tl.arange(0, BLOCK)
        words = load_words(x_ptr, n, b, BLOCK)
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_store(heap_ptr(bases, p, dst_off, tl.uint64) + w, words, e, mask=w < nwords)
    # 2. gather the same blocks from every rank, summing in rank order
    hdrs = heap_ptr(bases, rank, hdr_off + ((parity * WORLD * G + pid) * 2) * 8, tl.uint64)  # mine, from s
    ok = tl.full([], 1, tl.int1)
    for i in range(0, iters):
        if ok:
            b = pid + i * nprog
            w = b * BLOCK + tl.arange(0, BLOCK)
            acc, same = ll_sum_ranks(load_words(x_ptr, n, b, BLOCK), w, w < nwords, bases, rank, buf_off, parity,
                                     slot_words, e, b, timeout, diag, WORLD, BLOCK, DTYPE, hdrs=hdrs, hstride=G * 2,
                                     check=i == 0, sig=sig)
            ok = same
            if same:
                offs = b * EPB + tl.arange(0, EPB)
                tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=offs < n)
    epoch_commit(epoch_ptr, e)


class LL(AllReduceAlgorithm):
    """Launcher of ``ll_allreduce_kernel``. Workspace: 2 (parities) x W slots of LL8 packets, each
    slot the largest message as 32-bit words: 4 x W x the capacity."""

    barriers = False

    name = "ll"
    kernel = ll_allreduce_kernel
    shapes = MappingProxyType({"cuda": (16, 1024, 4), "cpu": (2, 1024, 1)})
    #: LL packets double the bytes on the wire; past this size LL never pays.
    limit = 1 << 20

    def layout(self) -> Workspace:
        self.slot_words = round_up(cdiv(self.capacity, 4), 2)  # even: 16-byte aligned slots
        self.hdr_rel = 2 * self.world * self.slot_words * 8  # then the signature packets
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 2 * 8)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice("ll", 2, 1024, 1)] if nbytes <= 64 << 10 else []
        if nbytes > cls.limit:
            return []
        words = cdiv(nbytes, 4)
        return [Choice("ll", min(progs, cdiv(words, block)), block, 4)
                for block in (256, 1024) for progs in (4, 16, 32)]

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n, nwords = x.numel(), cdiv(x.numel() * x.element_size(), 4)
        self.launcher(
            x, out, n, nwords, bases, rank, timeout, diag, ch.epochs_off, ch.buffer_off, self.slot_words, c.programs,
            ch.buffer_off + self.hdr_rel, sig, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(n),
            WDIV=pow2_divisor(nwords), num_warps=c.num_warps)
