"""Batch invariance: a row's output bits do not depend on how many other rows share the call or on which
algorithm sums it (every algorithm sums in fp32 over ranks 0..W-1 in that order and rounds once).

The fused norm's sum of squares is grouped by its launch shape: in the CPU world its blocks are small and
every variant and chunking groups alike; on GPUs wider blocks (``tl.sum`` over a whole block, its tree
set by the layout) make a row's bits follow the token count, so there the test is expected to fail
until the grouping is fixed (issue 74)."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc
from tritoncomm.collectives.allreduce import ALGORITHMS

from ..conftest import BACKEND
from ..helpers import make_comm, world_sizes

#: The row under test: hidden size, and the batch sizes it is placed in (at each position).
HIDDEN = 96
BATCHES = (1, 2, 3, 7, 16)


def _row(rank: int, dtype: torch.dtype, hidden: int = HIDDEN) -> torch.Tensor:
    """This rank's row: random values with signed zeros, tiny and large ones among them."""
    r = torch.randn(hidden, generator=torch.Generator().manual_seed(40 + rank)) * 3
    r[:6] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 6.0e4, -6.0e4])
    return r.to(dtype)


def _rows_job(ctx, dtype: torch.dtype):
    """The row's bits (as bytes) for every (algorithm, batch size, position), and for the other rows
    too much to carry: only the row's."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=max(BATCHES) * HIDDEN * 4, algos=tuple(ALGORITHMS))
    mine = _row(ctx.rank, dtype)
    seen = {}
    for algo in ar.algorithms:
        for batch in BATCHES:
            for at in sorted({0, batch // 2, batch - 1}):
                g = torch.Generator().manual_seed(1000 * batch + 10 * at + ctx.rank)
                x = (torch.randn(batch, HIDDEN, generator=g) * 5).to(dtype)
                x[at] = mine
                if batch * HIDDEN * x.element_size() > ar.capacity[algo]:
                    continue
                out = ar(x.to(ctx.device), algo=algo)
                seen[(algo, batch, at)] = out[at].cpu().view(torch.int16 if dtype != torch.float32 else torch.int32)
    ar.close()
    comm.close()
    return seen


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rows_bits_follow_neither_the_batch_nor_the_algorithm(worlds, world, dtype):
    results = worlds(world).run(_rows_job, dtype)
    want = torch.stack([_row(r, dtype).float() for r in range(world)]).sum(0).to(dtype)  # ranks 0..W-1 in order
    want_bits = want.view(torch.int16 if dtype != torch.float32 else torch.int32)
    assert len(results[0]) >= len(ALGORITHMS) * len(BATCHES), sorted(results[0])
    for rank, seen in enumerate(results):
        for key, bits in seen.items():
            assert torch.equal(bits, want_bits), (rank, key, (bits != want_bits).nonzero().flatten()[:8].tolist())


def _norm_job(ctx, rounding: str, hidden: int, programs: int | None, max_chunks: int | None):
    """The fused add-RMSNorm's output and new residual for the row, per (variant, batch, position)."""
    from tritoncomm.collectives.fused_norm import FUSED_ALGORITHMS, FusedAllReduceAddRMSNorm

    comm = make_comm(ctx, heap_bytes=64 << 20)
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=max(BATCHES), max_hidden=hidden, algos=tuple(FUSED_ALGORITHMS),
                                     rounding=rounding, programs=programs, max_chunks=max_chunks)
    mine = _row(ctx.rank, torch.bfloat16, hidden)
    res_row = _row(100, torch.bfloat16, hidden)  # the residual: the same on every rank
    weight = (torch.rand(hidden, generator=torch.Generator().manual_seed(9)) + 0.5).to(torch.bfloat16).to(ctx.device)
    seen = {}
    for algo in fused.algorithms:
        for batch in BATCHES:
            for at in sorted({0, batch // 2, batch - 1}):
                g = torch.Generator().manual_seed(1000 * batch + 10 * at + ctx.rank)
                x = (torch.randn(batch, hidden, generator=g) * 5).to(torch.bfloat16)
                res = (torch.randn(batch, hidden, generator=torch.Generator().manual_seed(batch + at)) * 5).to(
                    torch.bfloat16)
                x[at], res[at] = mine, res_row
                res_out = torch.empty_like(res).to(ctx.device)
                out = fused(x.to(ctx.device), res.to(ctx.device), weight, algo=algo, residual_out=res_out)
                seen[(algo, batch, at)] = (out[at].cpu().view(torch.int16), res_out[at].cpu().view(torch.int16))
    fused.close()
    comm.close()
    return seen


@pytest.mark.xfail(BACKEND == "cuda", strict=False, reason="GPU blocks group the sum of squares by launch shape")
@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("hidden,programs,max_chunks", [(HIDDEN, None, None), (2048, 8, 4)])
def test_a_fused_norm_rows_bits_follow_neither_the_batch_nor_the_variant(worlds, world, hidden, programs, max_chunks):
    """Rows of 96 columns (one chunk each), and rows of 2048 on 8 programs, cut into 1 to 4 chunks of
    512 columns as the token count falls (``RowPlan.chunks``, as on GPUs)."""
    results = worlds(world).run(_norm_job, "fused", hidden, programs, max_chunks)
    for rank, seen in enumerate(results):
        first_key = next(iter(seen))
        for key, (out, res) in seen.items():
            assert torch.equal(res, seen[first_key][1]), ("residual", rank, key, first_key)
            assert torch.equal(out, seen[first_key][0]), ("output", rank, key, first_key,
                                                          (out != seen[first_key][0]).nonzero().flatten()[:8].tolist())
