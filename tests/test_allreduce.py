"""All-reduce against torch.distributed on random data, at world 2, 3 and 4."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc

from .helpers import check_close, make_comm, reference_sum, same_on_all_ranks

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _job_sizes(ctx, algo, dtype, sizes, inplace):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, ll_max_bytes=256 << 10)
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(7919 * n + ctx.rank)
        x = (torch.randn(n, generator=g) * 4).to(dtype).to(ctx.device)
        ref = reference_sum(ctx, x)
        if inplace:
            out = ar(x, out=x, algo=algo)
            assert out.data_ptr() == x.data_ptr()
        else:
            out = torch.full_like(x, float("nan"))  # poison
            ar(x, out=out, algo=algo)
        comm.synchronize()
        err = check_close(out, ref, dtype)
        rows.append((n, err, same_on_all_ranks(ctx, out)))
    ar.close()
    comm.close()
    return rows


def _job_repeated(ctx, calls, dtype):
    """Back-to-back calls of changing sizes and algorithms; each checked."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, ll_max_bytes=16 << 10)
    g = torch.Generator().manual_seed(12345 + ctx.rank)
    sizes = torch.Generator().manual_seed(99)  # same sequence on every rank
    bad = []
    for i in range(calls):
        n = int(torch.randint(1, 20000, (1,), generator=sizes).item())
        x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
        out = torch.full_like(x, float("nan"))
        ar(x, out=out)
        comm.synchronize()
        ref = reference_sum(ctx, x)
        try:
            check_close(out, ref, dtype)
        except AssertionError as e:
            bad.append((i, n, ar.select(n * x.element_size()), str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append((i, n, "ranks differ"))
    ar.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo", ["ll", "oneshot"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_matches_torch_distributed(worlds, world, algo, dtype):
    sizes = [1, 2, 3, 127, 1001, 4099, 65537 if algo == "oneshot" else 20011]
    results = worlds(world).run(_job_sizes, algo, dtype, sizes, False)
    for rows in results:
        for n, _err, identical in rows:
            assert identical, f"rank results differ at n={n}"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("algo", ["ll", "oneshot"])
def test_allreduce_in_place(worlds, world, algo):
    results = worlds(world).run(_job_sizes, algo, torch.bfloat16, [1, 33, 5003], True)
    assert all(identical for rows in results for _, _, identical in rows)


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_100_repeated_calls(worlds, world):
    for bad in worlds(world).run(_job_repeated, 100, torch.bfloat16):
        assert bad == []


def _job_selection(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, ll_max_bytes=8 << 10)
    picks = [ar.select(b) for b in (2, 8 << 10, (8 << 10) + 2, 1 << 20)]
    ar.close()
    comm.close()
    return picks


def test_selection_is_the_same_on_every_rank(worlds):
    picks = worlds(3).run(_job_selection)
    assert picks[0] == ["ll", "ll", "oneshot", "oneshot"]
    assert all(p == picks[0] for p in picks)


def _job_graph_replay(ctx, algo, n, replays):
    """Capture three calls in a CUDA graph; replay with fresh data in the same buffers."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 22)
    x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ar(x, out=out, algo=algo)
    torch.cuda.current_stream().wait_stream(s)
    comm.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            ar(x, out=out, algo=algo)
    rows = []
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(replays):
        x.copy_(torch.randn(n, generator=g).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        comm.synchronize()
        ref = reference_sum(ctx, x)
        rows.append((check_close(out, ref, torch.bfloat16), same_on_all_ranks(ctx, out)))
    del graph
    ar.close()
    comm.close()
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algo", ["ll", "oneshot"])
def test_graph_capture_and_replay_with_fresh_data(worlds, world, algo):
    n = 4099 if algo == "ll" else 1_000_003
    for rows in worlds(world).run(_job_graph_replay, algo, n, 10):
        assert all(same for _, same in rows)
