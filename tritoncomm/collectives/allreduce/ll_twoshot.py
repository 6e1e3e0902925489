"""LL two-shot all-reduce: reduce-scatter then all-gather, both as LL8 packets, with no barrier.

The LL one-shot sends every rank's whole input to every peer: (W-1) x 2 x S bytes leave each GPU
(LL packets double the bytes). Past a few tens of KB at TP4 that traffic, not latency, sets the
time, while the barrier two-shot pays two release/acquire barriers. This variant keeps the LL
packets (a packet's flag says its data is there: no fence, no barrier) and the two-shot's traffic,
2 x (W-1)/W x 2 x S bytes per GPU, for two trips over NVLink instead of one.

The input, as 32-bit words (``load_words``), is cut into ``W`` shards of ``shard`` words; rank
``s`` owns shard ``s``. Program ``pid`` handles blocks ``pid, pid + P, ...`` (``BLOCK`` words)
of every shard:

1. push block ``b`` of every other rank's shard to that rank: packets into slot ``[parity][rank]``
   of its ``rs`` buffer (one 2-D load of the W blocks, then the stores);
2. sum block ``b`` of my shard over ranks 0..W-1 in that order in fp32 (``ll_sum_ranks``: mine
   from ``x``, the others' packets from my ``rs`` buffer), round once, write it to ``out`` and push
   it to every peer: packets into slot ``[parity][rank]`` of its ``ag`` buffer;
3. poll block ``b`` of every other shard from my ``ag`` buffer and write it to ``out``.

Every rank's result is the owner's rounded sum, so every rank holds the same bits.

**Buffer reuse.** Buffers alternate by epoch parity, as in ``allreduce_ll``: a rank writes the
buffers of parity ``k & 1`` for launch ``k + 2`` only after it finished launch ``k + 1``; that needs
a packet of launch ``k + 1`` from every peer, which the peer sent only after it finished launch
``k`` (kernels of one stream do not overlap), so no peer still reads them. Small or odd sizes can
leave a shard empty, and then a rank would get nothing from that shard's owner. So program 0
also sends every peer a token packet at the start and checks every peer's token before it ends:
whatever the size, finishing a launch means every peer has started it.

Layout in every rank's heap, uint64 packets: ``rs[2][W][slot_words]``, ``ag[2][W][slot_words]``,
``tokens[2][W]``. The output may be the input (in place): block ``b`` of shard ``s`` of ``x`` is
read (steps 1-2) and written (steps 2-3) only by program ``pid``, reads first.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ...kernels import (
    assume_multiple,
    epoch_commit,
    heap_ptr,
    ll8_poll,
    ll8_store,
    ll8_try,
    next_pow2,
    pow2_divisor,
    program_epoch,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .algorithm import AllReduceAlgorithm
from .ll import LL_TRIES, ll_send_signature, ll_sum_ranks, load_words

__all__ = ["LLTwoShot", "ll_twoshot_allreduce_kernel", "ll_wait_rows", "to_words", "token_check", "token_send",
           "words_to"]


@triton.jit
def to_words(vals, BLOCK: tl.constexpr):
    """``BLOCK`` 32-bit words from ``BLOCK * 32 // bits`` values (16-bit pairs or 32-bit bits),
    as ``load_words`` packs them."""
    if vals.dtype.primitive_bitwidth == 16:
        lo, hi = tl.split(tl.reshape(vals.to(tl.uint16, bitcast=True), [BLOCK, 2]))
        return lo.to(tl.uint32) | (hi.to(tl.uint32) << 16)
    else:
        return vals.to(tl.uint32, bitcast=True)


@triton.jit
def words_to(words, DTYPE: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse of ``to_words`` for an ``[R, BLOCK]`` tile of words: ``[R, BLOCK * 32 // bits]``
    values of ``DTYPE``."""
    if DTYPE.primitive_bitwidth == 16:
        lo = (words & 0xFFFF).to(tl.uint16).to(DTYPE, bitcast=True)
        hi = (words >> 16).to(tl.uint16).to(DTYPE, bitcast=True)
        return tl.reshape(tl.join(lo, hi), [R, 2 * BLOCK])
    else:
        return words.to(DTYPE, bitcast=True)


@triton.jit
def token_send(bases, rank, tok_off, parity, e, WORLD: tl.constexpr):
    """Program 0's token: one LL8 packet with flag ``e`` into slot ``[parity][rank]`` of every
    peer's token area (``tokens[2][W]`` at heap offset ``tok_off``): this rank has started the launch.
    Like every ``ll8_store``, a plain store: it orders nothing else this rank wrote; a peer that sees it
    learns only that this rank's previous launch (kernels of one stream do not overlap) is over."""
    k = tl.arange(0, next_pow2(WORLD))
    tok = heap_ptr(bases, tl.where(k < WORLD, k, rank), tok_off, tl.uint64) + parity * WORLD + rank
    ll8_store(tok, tl.zeros([next_pow2(WORLD)], dtype=tl.uint32), e, mask=(k < WORLD) & (k != rank))


@triton.jit
def token_check(bases, rank, tok_off, parity, e, timeout, diag, WORLD: tl.constexpr):
    """Program 0, last: wait until every peer's token of this launch is here (usually long since:
    one look; else a bounded ``ll8_poll`` per peer, whose timeout names the peer and slot -1). After
    it, every peer has finished its previous launch, so none still reads the buffers of this launch's
    parity that the next-but-one launch will write; no data is made visible by it."""
    k = tl.arange(0, next_pow2(WORLD))
    peers = (k < WORLD) & (k != rank)
    mytok = heap_ptr(bases, rank, tok_off, tl.uint64) + parity * WORLD + k
    _, bad = ll8_try(mytok, peers, e)
    if tl.sum(bad, axis=0) > 0:
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_poll(mytok, k == p, e, p, -1, rank, timeout, diag)


@triton.jit
def ll_wait_rows(src, mask, e, rank, slot, timeout, diag, WORLD: tl.constexpr, TRIES: tl.constexpr = LL_TRIES):
    """The data words of a ``[W2, B]`` tile of LL8 packets whose row ``s`` comes from rank ``s``
    (where ``mask``; my own row and padding masked off). Up to ``TRIES`` looks at the whole tile
    (``ll8_try``: every row's loads in flight together), then, only if packets are still missing, a
    bounded ``ll8_poll`` per peer's row (a timeout names that peer and ``slot``) and one more look.
    The contract is ``ll8_poll``'s: only the masked packets' data, once each carries ``e``."""
    W2: tl.constexpr = src.shape[0]
    B: tl.constexpr = src.shape[1]
    missing = tl.full([], 1, tl.int32)
    words = tl.zeros([W2, B], dtype=tl.uint32)
    for _t in tl.static_range(TRIES):
        if missing > 0:
            words, bad = ll8_try(src, mask, e)
            missing = tl.sum(tl.sum(bad, axis=1), axis=0)
    if missing > 0:
        row = tl.arange(0, W2)[:, None]
        for p in tl.static_range(WORLD):
            if p != rank:
                ll8_poll(tl.reshape(src, [W2 * B]), tl.reshape(mask & (row == p), [W2 * B]), e, p, slot, rank,
                         timeout, diag)
        words, bad = ll8_try(src, mask, e)  # every packet now carries e, and keeps it this launch
    return words


@triton.jit
def _push_shards(x_ptr, n, nwords, shard, b, bases, rank, rs_slot_off, e, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Step 1 for block ``b``: one 2-D load of block ``b`` of every shard, packets to their owners."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    EPW: tl.constexpr = 32 // DTYPE.primitive_bitwidth  # elements per word
    W2: tl.constexpr = next_pow2(WORLD)
    s = tl.arange(0, W2)
    r = tl.arange(0, BLOCK * EPW)
    el = (s[:, None] * shard + b * BLOCK) * EPW + r[None, :]  # element index
    rows = (s[:, None] < WORLD) & (s[:, None] != rank)
    v = tl.load(x_ptr + el, mask=rows & (b * BLOCK * EPW + r[None, :] < shard * EPW) & (el < n), other=0.0)
    if EPW == 2:
        lo, hi = tl.split(tl.reshape(v.to(tl.uint16, bitcast=True), [W2, BLOCK, 2]))
        words = lo.to(tl.uint32) | (hi.to(tl.uint32) << 16)
    else:
        words = v.to(tl.uint32, bitcast=True)
    j = b * BLOCK + tl.arange(0, BLOCK)
    wmask = rows & (j[None, :] < shard) & (s[:, None] * shard + j[None, :] < nwords)
    dst = heap_ptr(bases, tl.where(s < WORLD, s, rank), rs_slot_off, tl.uint64)
    ll8_store(dst[:, None] + j[None, :], words, e, mask=wmask)


@triton.jit
def _gather_shards(out_ptr, n, nwords, shard, b, bases, rank, ag_off, parity, slot_words, e, timeout, diag,
                   WORLD: tl.constexpr, BLOCK: tl.constexpr, TRIES: tl.constexpr = LL_TRIES):
    """Step 3 for block ``b``: the other shards' reduced packets from my ``ag`` buffer into ``out``.
    (``ll_wait_rows``)."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    EPW: tl.constexpr = 32 // DTYPE.primitive_bitwidth
    W2: tl.constexpr = next_pow2(WORLD)
    s = tl.arange(0, W2)
    j = b * BLOCK + tl.arange(0, BLOCK)
    rows = (s[:, None] < WORLD) & (s[:, None] != rank)
    wmask = rows & (j[None, :] < shard) & (s[:, None] * shard + j[None, :] < nwords)
    src = heap_ptr(bases, rank, ag_off, tl.uint64) + (parity * WORLD + s[:, None]) * slot_words + j[None, :]
    words = ll_wait_rows(src, wmask, e, rank, b, timeout, diag, WORLD, TRIES)
    r = tl.arange(0, BLOCK * EPW)
    el = (s[:, None] * shard + b * BLOCK) * EPW + r[None, :]
    tl.store(out_ptr + el, words_to(words, DTYPE, W2, BLOCK),
             mask=rows & (b * BLOCK * EPW + r[None, :] < shard * EPW) & (el < n))


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def ll_twoshot_allreduce_kernel(x_ptr, out_ptr, n, nwords, shard, bases, rank, timeout, diag_addr, epochs_off, rs_off,
                                ag_off, tok_off, slot_words, active, hdr_off, sig, WORLD: tl.constexpr,
                                BLOCK: tl.constexpr, NDIV: tl.constexpr = 1, WDIV: tl.constexpr = 1):
    """Sum ``n`` elements of ``x_ptr`` over the ranks into ``out_ptr`` (may equal ``x_ptr``), as
    ``nwords`` 32-bit words (``NDIV``/``WDIV``: powers of two dividing ``n``/``nwords``, for the
    vector widths); ``shard`` words per rank (a multiple of 4, at most ``slot_words``). Programs ``>= active``
    only keep their epoch in step. ``sig``: as in ``ll_allreduce_kernel``, compared with step 2's
    first sum; a program that finds a difference writes nothing and shares nothing."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    nwords = assume_multiple(nwords, WDIV)
    shard = assume_multiple(shard, 4)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    EPW: tl.constexpr = 32 // DTYPE.primitive_bitwidth
    diag = address_ptr(diag_addr, tl.int64)
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    if pid == 0:
        token_send(bases, rank, tok_off, parity, e, WORLD)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(shard, BLOCK) - pid, active)
        G = tl.num_programs(0)
        if sig is not None:
            if iters > 0:  # a program with no block reads no signature: it sends none
                ll_send_signature(bases, rank, hdr_off, parity, pid, G, sig, e, WORLD)
        rs_slot = rs_off + (parity * WORLD + rank) * slot_words * 8
        for i in range(0, iters):  # 1. reduce-scatter push
            _push_shards(x_ptr, n, nwords, shard, pid + i * active, bases, rank, rs_slot, e, WORLD, BLOCK)
        mine = rank * shard  # my shard's first word
        ag_slot = ag_off + (parity * WORLD + rank) * slot_words * 8
        hdrs = heap_ptr(bases, rank, hdr_off + ((parity * WORLD * G + pid) * 2) * 8, tl.uint64)  # mine, from s
        ok = tl.full([], 1, tl.int1)
        for i in range(0, iters):  # 2. reduce my shard's block, write it, push it to every peer
            if ok:
                b = pid + i * active
                j = b * BLOCK + tl.arange(0, BLOCK)
                wmask = (j < shard) & (mine + j < nwords)
                own = load_words(x_ptr + mine * EPW, n - mine * EPW, b, BLOCK)
                acc, same = ll_sum_ranks(own, j, wmask, bases, rank, rs_off, parity, slot_words, e, b, timeout, diag,
                                         WORLD, BLOCK, DTYPE, hdrs=hdrs, hstride=G * 2, check=i == 0, sig=sig)
                ok = same
                if same:
                    red = round_to(acc, DTYPE)
                    r = b * BLOCK * EPW + tl.arange(0, BLOCK * EPW)
                    tl.store(out_ptr + mine * EPW + r, red, mask=(r < shard * EPW) & (mine * EPW + r < n))
                    # branch-free (my own slot's store is masked off): under `if p != rank` Triton 3.6's
                    # layout pass shares one conversion of the packets across the branches and fails to
                    # compile (fp32, world 3-4)
                    words = to_words(red, BLOCK)
                    for p in tl.static_range(WORLD):
                        ll8_store(heap_ptr(bases, p, ag_slot, tl.uint64) + j, words, e, mask=wmask & (p != rank))
        if ok:  # every peer compared the same signatures: they all share their shards
            for i in range(0, iters):  # 3. all-gather: the other shards' blocks into out
                _gather_shards(out_ptr, n, nwords, shard, pid + i * active, bases, rank, ag_off, parity, slot_words,
                               e, timeout, diag, WORLD, BLOCK)
    if pid == 0:  # every peer has started this launch
        token_check(bases, rank, tok_off, parity, e, timeout, diag, WORLD)
    epoch_commit(epoch_ptr, e)


class LLTwoShot(AllReduceAlgorithm):
    """Launcher of ``ll_twoshot_allreduce_kernel``. Workspace: ``rs`` and ``ag``, each 2 (parities) x
    W slots of a shard's LL8 packets, plus the tokens: about 8 x the capacity."""

    barriers = False

    name = "ll_twoshot"
    kernel = ll_twoshot_allreduce_kernel
    shapes = MappingProxyType({"cuda": (32, 1024, 4), "cpu": (2, 512, 1)})
    #: It moves half the LL one-shot's bytes at TP4 (a quarter at TP8), so it serves up to this size.
    limit = 4 << 20

    def layout(self) -> Workspace:
        # words per (parity, source) slot: a rank's shard of the largest message, 16-word multiple
        self.slot_words = round_up(cdiv(cdiv(self.capacity, 4), self.world), 16)
        self.half = 2 * self.world * self.slot_words * 8  # rs or ag: [parity][source][slot_words] packets
        self.hdr_rel = 2 * self.half + 2 * self.world * 8  # after the tokens: the signature packets
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 2 * 8)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda" or not 16 << 10 <= nbytes <= cls.limit:
            return []
        # no barrier, so the barrier grids' caps (tools.tune) do not apply: more programs keep more
        # blocks in flight
        words = cdiv(nbytes, 4)
        return [Choice("ll_twoshot", min(progs, cdiv(words, block)), block, warps)
                for block, warps in ((256, 4), (1024, 8)) for progs in (16, 32, 64, 128)]

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n, nwords = x.numel(), cdiv(x.numel() * x.element_size(), 4)
        shard = round_up(cdiv(nwords, world), 16)  # words; 16-word multiples keep 16-byte vectors
        rs = ch.buffer_off
        self.launcher(
            x, out, n, nwords, shard, bases, rank, timeout, diag, ch.epochs_off, rs, rs + self.half, rs + 2 * self.half,
            self.slot_words, c.programs, rs + self.hdr_rel, sig, WORLD=world, BLOCK=c.block, NDIV=pow2_divisor(n),
            WDIV=pow2_divisor(nwords), num_warps=c.num_warps)
