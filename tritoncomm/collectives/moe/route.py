"""MoE dispatch, step 2 of 3 (local: it reads only this rank's heap, after the send kernel).

Every rank holds every rank's routing after step 1, so every rank computes the same slots without
talking: the entries ``i = (source rank, token, j)`` (flattened in that order) of expert ``e`` get
slots ``0, 1, ...`` in order; entries at or past ``capacity`` are dropped.

``moe_route_kernel``: program ``e`` (one per expert, every rank runs all of them) scans the ids table
in order, each source's rows below its token count only, keeping a running count. For this rank's
own entries of ``e`` it writes where ``combine`` will find the expert's output (``owner``, and ``row =
local expert * capacity + slot``; dropped entries keep ``owner = -1`` and are counted in ``bad[1]``).
If ``e`` is one of this rank's experts it also writes, for each of its entries, its row in the expert
buffer or -1 if dropped (``slot_of[entry]``, read by the gather kernel and the owner-side combine),
and the expert's count (``min(entries, capacity)``).

It reads the tables' half given by the parity of the epoch the send kernel's program 0 stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernels import heap_ptr
from ...kernels.launcher import Launcher

__all__ = ["launch_route", "moe_route_kernel"]


@triton.jit(do_not_specialize=["rank"])
def moe_route_kernel(owner_ptr, row_ptr, slot_ptr, counts_ptr, bad_ptr, max_tokens, capacity, bases, rank,
                     epochs_off, ids_off, ids_half, ntab_off, ntab_half, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                     TOP_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """See the module docstring."""
    e = tl.program_id(0)
    parity = (tl.load(heap_ptr(bases, rank, epochs_off, tl.uint32)) & 1).to(tl.int64)
    ids = heap_ptr(bases, rank, ids_off + parity * ids_half, tl.int32)
    ntab = heap_ptr(bases, rank, ntab_off + parity * ntab_half, tl.int32)
    owner = e // LOCAL
    mine = owner == rank
    el = e - owner * LOCAL
    seen = 0
    dropped = 0
    for s in range(WORLD):
        n_s = tl.load(ntab + s) * TOP_K  # the source's live entries
        base = s * max_tokens * TOP_K
        own = s == rank
        for b in range(0, n_s, BLOCK_E):
            k = b + tl.arange(0, BLOCK_E)
            i = base + k
            hit = tl.load(ids + i, mask=k < n_s, other=-1) == e
            n_hit = tl.sum(hit.to(tl.int32))
            if n_hit > 0:
                slot = seen + tl.cumsum(hit.to(tl.int32), 0) - 1
                keep = hit & (slot < capacity)
                if own:
                    tl.store(owner_ptr + k, tl.where(keep, owner, -1), mask=hit)
                    tl.store(row_ptr + k, el * capacity + slot, mask=keep)
                    dropped += tl.sum((hit & ~keep).to(tl.int32))
                if mine:
                    tl.store(slot_ptr + i, tl.where(keep, el * capacity + slot, -1), mask=hit)
                seen += n_hit
    if mine:
        tl.store(counts_ptr + el, tl.minimum(seen, capacity))
    if dropped > 0:
        tl.atomic_add(bad_ptr + 1, dropped.to(tl.int64))


def launch_route(run: Launcher, comm, channel, owner: torch.Tensor, row: torch.Tensor,
                 slot_of: torch.Tensor, counts: torch.Tensor, bad: torch.Tensor, *, max_tokens: int, capacity: int,
                 local: int, top_k: int, ids_off: int, ids_half: int, ntab_off: int, ntab_half: int, block_e: int,
                 num_warps: int) -> None:
    """Launch ``moe_route_kernel`` through ``run`` (its launcher: one program per expert)."""
    bases, rank, world, _, _ = comm.kernel_args()
    run(owner, row, slot_of, counts, bad, max_tokens, capacity, bases, rank, channel.epochs_off, ids_off,
        ids_half, ntab_off, ntab_half, WORLD=world, LOCAL=local, TOP_K=top_k, BLOCK_E=block_e, num_warps=num_warps)

