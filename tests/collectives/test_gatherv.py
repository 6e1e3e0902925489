"""All-gather and reduce-scatter with a different number of rows on every rank (``sizes=``, what
``all_gatherv`` / ``reduce_scatterv`` take), against references every rank builds from every rank's
seeded inputs: the all-gather's rows exactly, the reduce-scatter's sums in rank order (fp32, rounded
once), bit for bit."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc
from tritoncomm.collectives.allgather.push import MAX_ROWS, packed_rows

from ..conftest import BACKEND
from ..helpers import make_comm, same_on_all_ranks, world_sizes

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows(world: int, case: int) -> list[int]:
    """Rows per rank: a rank with none, one row apart, large and small, one rank holding all."""
    return [[r for r in range(world)],
            [1 + 2 * r for r in range(world)],
            [300 if r == world - 1 else 5 + r for r in range(world)],
            [37 if r == 1 else 0 for r in range(world)]][case]


def _x(rank: int, rows: list[int], hidden: int, dtype: torch.dtype, seed: int, what: str) -> torch.Tensor:
    n = rows[rank] if what == "ag" else sum(rows)
    g = torch.Generator().manual_seed(seed * 1000 + rank * 10 + (what == "rs"))
    return torch.randn(n, hidden, generator=g).to(dtype)


def _job(ctx, dtype: torch.dtype, hidden: int) -> list:
    comm = make_comm(ctx)
    ag = tc.AllGather(comm, max_bytes=1 << 20)
    rs = tc.ReduceScatter(comm, max_bytes=1 << 20)
    bad = []
    for seed in range(2):  # repeated calls, fresh data
        for case in range(4):
            rows = _rows(ctx.world, case)
            xs = [_x(r, rows, hidden, dtype, seed, "ag") for r in range(ctx.world)]
            out = torch.full((sum(rows), hidden), float("nan"), dtype=dtype, device=ctx.device)
            ag(xs[ctx.rank].to(ctx.device), out, sizes=rows)
            comm.synchronize()
            if not torch.equal(out.cpu(), torch.cat(xs)):
                bad.append(("all_gather", rows, seed))
            ys = [_x(r, rows, hidden, dtype, seed, "rs") for r in range(ctx.world)]
            start = sum(rows[:ctx.rank])
            want = torch.stack([y.float() for y in ys]).sum(0).to(dtype)[start:start + rows[ctx.rank]]
            got = rs(ys[ctx.rank].to(ctx.device), sizes=rows)  # a new output
            comm.synchronize()
            if got.shape != want.shape or not torch.equal(got.cpu(), want):
                bad.append(("reduce_scatter", rows, seed))
    return bad + _edges(ctx, comm, ag, rs, dtype)


def _edges(ctx, comm, ag, rs, dtype) -> list:
    """Equal sizes take the equal-shard path (same bits); past the slots' bound without a fallback
    group, sizes of the wrong length and a count that is not this rank's raise before any rank
    waits; every rank holds the same all-gather output."""
    w, bad = ctx.world, []
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(ctx.rank)).to(dtype).to(ctx.device)
    if not torch.equal(ag(x, sizes=[3] * w).cpu(), ag(x).cpu()):
        bad.append("equal sizes")
    mine = torch.randn(ctx.rank + 1, 8, generator=torch.Generator().manual_seed(ctx.rank)).to(dtype)
    if not same_on_all_ranks(ctx, ag(mine.to(ctx.device), sizes=[r + 1 for r in range(w)])):
        bad.append("not the same on every rank")
    big = [1 if r else (1 << 20) // 8 for r in range(w)]  # rank 0's rows alone fill max_bytes
    for bad_sizes, what in ((big, "too large"), ([3] * (w + 1), "wrong length"),
                            ([4] * w, "not this rank's count"), ([3] * (w - 1) + [-1], "negative")):
        try:
            xx = torch.zeros(big[ctx.rank], 8, dtype=dtype, device=ctx.device) if what == "too large" else x
            ag(xx, sizes=bad_sizes)
            bad.append(f"all_gather {what}: no error")
        except tc.InvalidInputError:
            pass
    try:
        rs(x, sizes=[2] * (w - 1) + [5])  # rows do not sum to x's
        bad.append("reduce_scatter rows: no error")
    except tc.InvalidInputError:
        pass
    ag.close()
    rs.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_gatherv_and_scatterv_match_references(worlds, world, dtype):
    for bad in worlds(world).run(_job, dtype, 24 if dtype == torch.float32 else 40):
        assert bad == []


def _fallback(ctx) -> list:
    """Shards past the slots' bound go to the fallback group: the all-gather exact, the
    reduce-scatter within rounding (the group's own order)."""
    comm = make_comm(ctx)
    ag = tc.AllGather(comm, max_bytes=1 << 12, fallback_group=ctx.group)  # the device's group (gloo or NCCL)
    rs = tc.ReduceScatter(comm, max_bytes=1 << 12, fallback_group=ctx.group)
    rows = [40 + 9 * r for r in range(ctx.world)]  # 4 KB of slots hold 8 rows of 32 floats per rank at world 4
    xs = [_x(r, rows, 32, torch.float32, 5, "ag") for r in range(ctx.world)]
    ok = [torch.equal(ag(xs[ctx.rank].to(ctx.device), sizes=rows).cpu(), torch.cat(xs))]
    ys = [_x(r, rows, 32, torch.float32, 5, "rs") for r in range(ctx.world)]
    start = sum(rows[:ctx.rank])
    want = torch.stack(ys).sum(0)[start:start + rows[ctx.rank]]
    ok.append(torch.allclose(rs(ys[ctx.rank].to(ctx.device), sizes=rows).cpu(), want, atol=1e-5))
    ag.close()
    rs.close()
    comm.close()
    return ok


@pytest.mark.parametrize("world", world_sizes(3))
def test_gatherv_and_scatterv_fall_back_past_their_bound(worlds, world):
    for ok in worlds(world).run(_fallback):
        assert all(ok), ok


def test_packed_rows_round_trip():
    """Eight ranks' counts, the largest among them, in two words, read back as the kernels do."""
    rows = (MAX_ROWS, 0, 1, 2 ** 15, 7, MAX_ROWS, 12345, 1)
    lo, hi = packed_rows(rows)
    back = [((lo if r < 4 else hi) >> (16 * (r % 4))) & 0xFFFF for r in range(8)]
    assert tuple(back) == rows and all(-(1 << 63) <= w < 1 << 63 for w in (lo, hi))


@pytest.mark.skipif(BACKEND != "cpu", reason="the 8-rank CPU world")
def test_gatherv_at_eight_ranks(worlds):
    for bad in worlds(8).run(_job, torch.bfloat16, 16):
        assert bad == []
