"""Batch invariance of the other collectives the engines' deterministic modes may run: a row's output bits
do not depend on how many other rows share the call, nor on the algorithm or path that serves it
(``test_determinism.py`` covers the all-reduce and the fused norm). The reduce-scatter and the all-gather
are compared with a host function of the row alone (the fp32 sum over ranks 0..W-1, rounded once; a copy),
the GEMM + all-reduce and the MoE combine with the same row alone in a call."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc

from ..conftest import BACKEND
from ..helpers import make_comm, world_sizes

H = 48
BATCHES = (1, 2, 5, 12)


def _row(rank: int, k: int, dtype: torch.dtype, h: int = H) -> torch.Tensor:
    return (torch.randn(h, generator=torch.Generator().manual_seed(31 * k + rank)) * 3).to(dtype)


def _inputs(rank: int, world: int, batch: int, at: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s reduce-scatter input: ``batch * world`` random rows, the row under test at ``at``."""
    g = torch.Generator().manual_seed(100 * batch + at + 7 * rank)
    x = (torch.randn(batch * world, H, generator=g) * 5).to(dtype)
    x[at] = _row(rank, 0, dtype)
    return x


def _rs_ag_job(ctx, dtype: torch.dtype):
    """Per batch and position, this rank's reduce-scatter output rows and all-gather output (of its
    own shard of its input)."""
    comm = make_comm(ctx)
    w = ctx.world
    rs = tc.ReduceScatter(comm, max_bytes=max(BATCHES) * w * H * 4)
    ag = tc.AllGather(comm, max_bytes=max(BATCHES) * w * H * 4)
    seen = {}
    for batch in BATCHES:
        for at in sorted({0, batch * w - 1}):
            x = _inputs(ctx.rank, w, batch, at, dtype)
            out = torch.full((batch, H), float("nan"), dtype=dtype).to(ctx.device)  # poisoned
            rs(x.to(ctx.device), out)
            gathered = torch.full((batch * w, H), float("nan"), dtype=dtype).to(ctx.device)
            ag(x[ctx.rank * batch:(ctx.rank + 1) * batch].to(ctx.device), gathered)
            seen[(batch, at)] = (out.cpu(), gathered.cpu())
    rs.close()
    ag.close()
    comm.close()
    return seen


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reduce_scatter_and_all_gather_rows_are_functions_of_the_row(worlds, world, dtype):
    """The row under test lands on rank 0 (first row) or the last rank (last row): its reduce-scatter output
    is the fp32 sum over ranks in order rounded once, whatever the batch; the all-gather gives every rank's
    shard back exactly."""
    want = torch.stack([_row(r, 0, dtype).float() for r in range(world)]).sum(0).to(dtype)
    for rank, seen in enumerate(worlds(world).run(_rs_ag_job, dtype)):
        for (batch, at), (out, gathered) in seen.items():
            if at // batch == rank:
                assert torch.equal(out[at % batch], want), ("reduce-scatter", rank, batch, at)
            shards = torch.cat([_inputs(r, world, batch, at, dtype)[r * batch:(r + 1) * batch] for r in range(world)])
            assert torch.equal(gathered, shards), ("all-gather", rank, batch, at)


def _gemm_job(ctx, paths: tuple[str, ...]):
    """The GEMM + all-reduce of a row alone and inside batches, by every path: the row's output bits."""
    from tritoncomm.collectives.gemm import GemmAllReduce, GemmConfig

    comm = make_comm(ctx, heap_bytes=64 << 20)
    k, n = 64, 32
    op = GemmAllReduce(comm, max_tokens=max(BATCHES) * 4, n=n, config=GemmConfig.for_backend(comm.backend),
                       overlap_min_tokens=None)
    wt = (torch.randn(n, k, generator=torch.Generator().manual_seed(9 + ctx.rank)) / 8).to(torch.bfloat16)
    row = (torch.randn(k, generator=torch.Generator().manual_seed(3 + ctx.rank))).to(torch.bfloat16)
    seen = {}
    for path in paths:
        for batch in (1, 3, 16, 48):
            for at in sorted({0, batch - 1}):
                x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch + at + ctx.rank)).to(
                    torch.bfloat16)
                x[at] = row
                out = op(x.to(ctx.device), wt.to(ctx.device), path=path)
                seen[(path, batch, at)] = out[at].cpu().view(torch.int16).clone()
    op.close()
    comm.close()
    return seen


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_gemm_allreduce_rows_follow_neither_the_batch_nor_the_path(worlds, world):
    """Every path (the overlapped kernel on GPUs only: it needs TMA) gives a row the same bits alone and
    in batches of 3, 16 and 48 rows."""
    paths = ("plain", "chunked", "overlap") if BACKEND == "cuda" else ("plain", "chunked")
    for rank, seen in enumerate(worlds(world).run(_gemm_job, paths)):
        first_key = next(iter(seen))
        for key, bits in seen.items():
            assert torch.equal(bits, seen[first_key]), (rank, key, first_key)


def _moe_job(ctx, mode: str, shape_kind: str):
    """MoE dispatch + combine with identity experts (the expert buffer as dispatched): the combined output
    of a token with fixed routing and weights, alone and inside batches."""
    from dataclasses import replace

    from tritoncomm.collectives.moe import SHAPES, MoEAllToAll

    comm = make_comm(ctx, heap_bytes=64 << 20)
    w = ctx.world
    experts, k, hidden, most = 2 * w, 3, 64, 8
    shape = {"one-kernel": None, "send-gather": replace(SHAPES["cpu"], one_kernel=False),
             "routed": replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2)}[shape_kind]
    moe = MoEAllToAll(comm, max_tokens=most, hidden=hidden, num_experts=experts, top_k=k, mode=mode, shape=shape)
    token = torch.randn(hidden, generator=torch.Generator().manual_seed(77 + ctx.rank)).to(torch.bfloat16)
    ids_t = torch.tensor([(ctx.rank + 1) % experts, (ctx.rank + 3) % experts, ctx.rank % experts])
    wts_t = torch.tensor([0.3, 0.45, 0.25])
    seen = {}
    for batch in (1, 3, most):
        for at in sorted({0, batch - 1}):
            g = torch.Generator().manual_seed(100 * batch + at + 13 * ctx.rank)
            x = torch.randn(batch, hidden, generator=g).to(torch.bfloat16)
            ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(batch)])
            wts = torch.rand(batch, k, generator=g)
            x[at], ids[at], wts[at] = token, ids_t, wts_t
            out, _, handle = moe.dispatch(x.to(ctx.device), ids.to(ctx.device), wts.to(ctx.device))
            y = moe.expert_buffer()
            y.copy_(out)
            combined = moe.combine(y, handle)
            seen[(batch, at)] = combined[at].cpu().view(torch.int16).clone()
    moe.close()
    comm.close()
    return seen


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("shape_kind", ["one-kernel", "send-gather", "routed"])
def test_moe_combine_rows_follow_neither_the_batch_nor_the_mode(worlds, world, shape_kind):
    """A token's combined output has the same bits alone and inside batches of 3 and 8 tokens, in the
    latency and the throughput mode, on each dispatch path (``combine.py``: the sum per owner in ``j``
    order, the owners' partials in rank order)."""
    per_mode = [worlds(world).run(_moe_job, mode, shape_kind) for mode in ("latency", "throughput")]
    for rank in range(world):
        first = per_mode[0][rank][(1, 0)]
        for seen in per_mode:
            for key, bits in seen[rank].items():
                assert torch.equal(bits, first), (rank, key)
