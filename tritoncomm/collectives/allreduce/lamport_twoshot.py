"""Lamport two-shot all-reduce (``lamport_twoshot_kernel``): the one-shot's buffers and rules
(``allreduce.lamport``: values, buffer reuse, the call check) over shards.

The input is cut into W shards of ``shard`` elements; rank ``s`` owns shard ``s``. Program ``pid``
handles blocks ``pid, pid + P, ...`` of every shard:

1. store block ``b`` of every other rank's shard into slot [my rank] of that rank's ``rs`` buffer
   (one 2-D load of the W blocks, then the stores);
2. poll block ``b`` of my shard from the W-1 other slots of my ``rs`` buffer, sum ranks 0..W-1 in fp32,
   round once, write it to ``out`` and store it into slot [my rank] of every peer's ``ag`` buffer;
   reset what was read;
3. poll block ``b`` of every other shard from my ``ag`` buffer, write it to ``out``, reset.

Every rank's result is the owner's rounded sum, so every rank holds the same bits. Each GPU moves
``2 (W-1)/W x S`` bytes, in two trips. The reduced shard goes through ``lamport_canonical`` before it
is written anywhere. Program 0 also swaps a token with every peer (as ``ll_twoshot`` does): sizes that
leave a shard empty would otherwise let a rank finish a launch without hearing from every peer.

Layout in every rank's heap: ``rs[2][W][slot_bytes]``, ``ag[2][W][slot_bytes]``, the tokens
(``ll_twoshot``'s ``[2][W]`` LL8 packets), then the headers ``[2][W][grid]``.
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
    lamport_canonical,
    lamport_reset,
    lamport_store,
    next_pow2,
    pdl_launch_dependents,
    pdl_wait,
    pow2_divisor,
    program_epoch,
    round_to,
)
from ...kernels.memory import address_ptr
from ...units import cdiv, round_up
from ..base import PeerOutput, Workspace
from ..selection import Choice
from .lamport import (
    LAMPORT_TRIES,
    LamportAlgorithm,
    lamport_send_signature,
    lamport_sum_ranks,
    lamport_wait_rows,
    one_block_shapes,
)
from .ll_twoshot import token_check, token_send

__all__ = ["LamportTwoShot", "lamport_twoshot_kernel"]


@triton.jit(do_not_specialize=["rank", "sig"])  # one compiled kernel for every rank and call
def lamport_twoshot_kernel(x_ptr, out_ptr, n, shard, bases, rank, timeout, diag_addr, epochs_off, rs_off, ag_off,
                           tok_off, slot_bytes, active, hdr_off, sig, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                           NDIV: tl.constexpr = 1, TRIES: tl.constexpr = LAMPORT_TRIES, EARLY: tl.constexpr = False):
    """Sum ``n`` elements over the ranks into ``out_ptr`` (may equal ``x_ptr``); ``shard`` elements per
    rank (a multiple of 16, at most ``slot_bytes`` bytes). Programs ``>= active`` only keep their epoch
    in step. ``EARLY``: as in ``lamport_oneshot_kernel``. ``sig``: as there, the headers travel with
    the first block of step 1 and are compared with step 2's first sum; a program that finds a
    difference writes nothing and shares nothing."""
    pid = tl.program_id(0)
    n = assume_multiple(n, NDIV)
    shard = assume_multiple(shard, 16)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    W2: tl.constexpr = next_pow2(WORLD)
    diag = address_ptr(diag_addr, tl.int64)
    pdl_wait()  # launched with PDL: the previous kernel has ended
    if EARLY:
        pdl_launch_dependents()
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    if pid == 0:
        token_send(bases, rank, tok_off, parity, e, WORLD)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(shard, BLOCK) - pid, active)
        slot_elems = slot_bytes // ESIZE
        s = tl.arange(0, W2)
        rows = (s[:, None] < WORLD) & (s[:, None] != rank)
        to_owner = heap_ptr(bases, tl.where(s < WORLD, s, rank), rs_off + (parity * WORLD + rank) * slot_bytes, DTYPE)
        G = tl.num_programs(0)
        hdrs = heap_ptr(bases, rank, hdr_off + (parity * WORLD * G + pid) * 8, tl.int64)  # mine, from rank s
        if sig is not None:
            if iters > 0:  # a program with no block reads no header: it sends none
                lamport_send_signature(bases, rank, hdr_off, parity, pid, G, sig, WORLD)
        for i in range(0, iters):  # 1. every other rank's block, to its owner
            j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
            idx = s[:, None] * shard + j[None, :]
            m = rows & (j[None, :] < shard) & (idx < n)
            v = tl.load(x_ptr + idx, mask=m)  # every load before the first store
            lamport_store(to_owner[:, None] + j[None, :], v, mask=m)
        pdl_launch_dependents()
        rs_mine = heap_ptr(bases, rank, rs_off + parity * WORLD * slot_bytes, DTYPE)
        ok = tl.full([], 1, tl.int1)
        for i in range(0, iters):  # 2. my shard's block: sum, round, write, share
            if ok:
                b = pid + i * active
                j = b * BLOCK + tl.arange(0, BLOCK)
                idx = rank * shard + j
                m = (j < shard) & (idx < n)
                own = lamport_canonical(tl.load(x_ptr + idx, mask=m, other=0.0))
                acc, same = lamport_sum_ranks(own, rs_mine, slot_elems, j, m, rank, b, timeout, diag, WORLD, TRIES,
                                              hdrs, G, i == 0, sig)
                ok = same
                if same:
                    red = lamport_canonical(round_to(acc, DTYPE))  # what every peer will receive
                    tl.store(out_ptr + idx, red, mask=m)
                    for p in tl.static_range(WORLD):  # branch-free, as in ll_twoshot
                        dst = heap_ptr(bases, p, ag_off + (parity * WORLD + rank) * slot_bytes, DTYPE)
                        lamport_store(dst + j, red, mask=m & (p != rank))
        if ok:  # every peer compared the same signatures: they all share their shards
            ag_mine = heap_ptr(bases, rank, ag_off + parity * WORLD * slot_bytes, DTYPE)
            for i in range(0, iters):  # 3. the other shards' blocks from my ag buffer
                b = pid + i * active
                j = b * BLOCK + tl.arange(0, BLOCK)
                idx = s[:, None] * shard + j[None, :]
                m = rows & (j[None, :] < shard) & (idx < n)
                src = ag_mine + s[:, None] * slot_elems + j[None, :]
                tl.store(out_ptr + idx, lamport_wait_rows(src, m, rank, b, timeout, diag, WORLD, TRIES), mask=m)
                lamport_reset(src, m, SYNC=False)  # each element in one thread (the launch shapes' rule)
    if pid == 0:  # every peer has started this launch
        token_check(bases, rank, tok_off, parity, e, timeout, diag, WORLD)
    epoch_commit(epoch_ptr, e)


class LamportTwoShot(LamportAlgorithm):
    """Launcher of ``lamport_twoshot_kernel``. Workspace: ``rs`` and ``ag``, 2 (parities) x W shard
    slots each (about 4 x the capacity), and the tokens."""

    name = "lamport_twoshot"
    kernel = lamport_twoshot_kernel
    shapes = MappingProxyType({"cuda": (64, 512, 1), "cpu": (2, 1024, 1)})
    limit = 16 << 20

    def layout(self) -> Workspace:
        self.slot_bytes = round_up(cdiv(self.capacity, self.world) + 64, 256)  # a shard, padded to 16 elements
        self.half = 2 * self.world * self.slot_bytes
        self.hdr_rel = 2 * self.half + 2 * self.world * 8  # after the tokens (LL8 packets); 0 at rest
        return Workspace(buffer_bytes=self.hdr_rel + 2 * self.world * self.grid * 8, lamport_bytes=2 * self.half)

    @classmethod
    def candidates(cls, nbytes: int, backend: str) -> list[Choice]:
        if backend != "cuda":
            return [Choice("lamport_twoshot", 2, 1024, 1)]
        if not 128 << 10 <= nbytes <= cls.limit:
            return []
        return [c for w in (2, 4, 8) for c in one_block_shapes("lamport_twoshot", cdiv(cdiv(nbytes, 2), w))]

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        n = x.numel()
        rs = ch.buffer_off
        self.launcher(
            x, out, n, round_up(cdiv(n, world), 16), bases, rank, timeout, diag, ch.epochs_off, rs, rs + self.half,
            rs + 2 * self.half, self.slot_bytes, c.programs, rs + self.hdr_rel, sig, WORLD=world, BLOCK=c.block,
            NDIV=pow2_divisor(n), TRIES=self.tries, EARLY=self.early, num_warps=c.num_warps, **self.launch_opts)
