"""Row-parallel GEMM + all-reduce: both paths against torch.distributed on random data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tritoncomm as tc
from tritoncomm.collectives import GemmAllReduce

from ..helpers import make_comm, reference_sum, same_on_all_ranks, warm_up_for_capture, world_sizes


def _inputs(ctx, m, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed * 100 + ctx.rank)
    x = (torch.randn(m, k, generator=g) / k ** 0.5).to(dtype).to(ctx.device)
    w = torch.randn(n, k, generator=g).to(dtype).to(ctx.device)
    return x, w


def _job_gemm(ctx, shapes, dtype, paths):
    comm = make_comm(ctx)
    n = shapes[0][2]
    op = GemmAllReduce(comm, max_tokens=48, n=n, overlap_min_tokens=8)
    bad = []
    for i, (m, k, _) in enumerate(shapes):
        x, w = _inputs(ctx, m, k, n, dtype, i)
        ref = reference_sum(ctx, (x.float() @ w.float().t()))
        for spec in paths:
            path, kw = spec if isinstance(spec, tuple) else (spec, {})
            out = torch.full((m, n), float("nan"), dtype=dtype, device=ctx.device)
            op(x, w, out=out, path=path, **kw)
            comm.synchronize()
            o = out.float().cpu()
            err = ((o - ref).abs().max() / ref.abs().max()).item()
            if not torch.isfinite(o).all() or err > 2e-2:
                bad.append((m, k, path, err))
            if not same_on_all_ranks(ctx, out):
                bad.append((m, k, path, "ranks differ"))
    if paths == (None,):
        bad += [("select", op.select(1), op.select(8))] if (op.select(1), op.select(8)) != ("plain", "overlap") else []
    op.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_gemm_allreduce_both_paths(worlds, world):
    # M not a multiple of the tile, K not a multiple of BK, N not a multiple of BN; repeated calls
    # with different M alternate the tile buffers.
    # The chunked path also in 3 slices whose all-reduces run on one program each (side_programs).
    shapes = [(17, 40, 40), (1, 32, 40), (33, 48, 40), (8, 24, 40)]
    # (The SM carve-out only applies on GPUs; the CPU world ignores it.)
    paths = ("overlap", "chunked", "plain", ("chunked", {"chunks": 3, "side_programs": 1}),
             ("chunked", {"chunks": 2, "side_programs": 8, "sm_carveout": 8}))
    for bad in worlds(world).run(_job_gemm, shapes, torch.bfloat16, paths):
        assert bad == []


def test_gemm_allreduce_fp16_selected(worlds):
    for bad in worlds(2).run(_job_gemm, [(5, 32, 48), (20, 32, 48)], torch.float16, (None,)):
        assert bad == []


def _job_gemm_bad(ctx):
    comm = make_comm(ctx)
    op = GemmAllReduce(comm, max_tokens=16, n=32)
    d = ctx.device
    x = torch.ones(4, 16, dtype=torch.bfloat16, device=d)
    w = torch.ones(32, 16, dtype=torch.bfloat16, device=d)
    cases = {
        "k": lambda: op(x, torch.ones(32, 8, dtype=torch.bfloat16, device=d)),
        "n": lambda: op(x, torch.ones(48, 16, dtype=torch.bfloat16, device=d)),
        "tokens": lambda: op(torch.ones(17, 16, dtype=torch.bfloat16, device=d), w),
        "dtype": lambda: op(x, w.half()),
        "strided": lambda: op(torch.ones(16, 4, dtype=torch.bfloat16, device=d).t(), w),
        "path": lambda: op(x, w, path="magic"),
        "side_programs": lambda: op(x, w, path="chunked", side_programs=0),
        "chunks": lambda: op(x, w, path="chunked", chunks=0),
        "k_tma": lambda: op(torch.ones(4, 12, dtype=torch.bfloat16, device=d),
                            torch.ones(32, 12, dtype=torch.bfloat16, device=d), path="overlap"),
        "misaligned": lambda: op(torch.ones(4 * 16 + 1, dtype=torch.bfloat16, device=d)[1:].view(4, 16), w,
                                 path="overlap"),
    }
    caught = {}
    for key, fn in cases.items():
        try:
            fn()
            caught[key] = None
        except tc.InvalidInputError as e:
            caught[key] = str(e)
    out = op(x, w, path="overlap")  # still works after the refusals
    comm.synchronize()
    ok = bool((out.float().cpu() == 16 * ctx.world).all())
    # selected (not forced), a misaligned view takes the plain path instead of failing
    eager = GemmAllReduce(comm, max_tokens=16, n=32, overlap_min_tokens=1)
    assert eager.select(4, 16) == "overlap"
    view = torch.ones(4 * 16 + 1, dtype=torch.bfloat16, device=d)[1:].view(4, 16)
    out = eager(view, w)
    comm.synchronize()
    ok = ok and bool((out.float().cpu() == 16 * ctx.world).all())
    eager.close()
    op.close()
    comm.close()
    return caught, ok


def test_gemm_allreduce_bad_input(worlds):
    for caught, ok in worlds(2).run(_job_gemm_bad):
        assert all(caught.values()), caught
        assert ok


def _job_gemm_registered(ctx, shapes):
    """The overlapped path into a registered output (peers store the reduced tiles straight into it)
    gives the bits of the same path into a regular output, which peers do not touch; so does the
    kernel that publishes each tile's stores one tile later (``defer``)."""
    comm = make_comm(ctx)
    n = shapes[0][2]
    op = GemmAllReduce(comm, max_tokens=48, n=n)
    deferred = GemmAllReduce(comm, max_tokens=48, n=n, config=dataclasses.replace(op.cfg, defer=True))
    bad = []
    reg = comm.empty((48, n), torch.bfloat16) if ctx.backend != "cuda" else torch.empty(48, n, dtype=torch.bfloat16,
                                                                                          device=ctx.device)
    comm.register(reg)
    for i, (m, k, _) in enumerate(shapes):
        x, w = _inputs(ctx, m, k, n, torch.bfloat16, 10 + i)
        ref = reference_sum(ctx, (x.float() @ w.float().t()))
        plain = op(x, w, path="overlap")
        out = reg[:m]  # a registered tensor's leading rows: the same row of the table, offset 0
        out.fill_(float("nan"))
        op(x, w, out=out, path="overlap")
        comm.synchronize()
        err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
        late = deferred(x, w, path="overlap")  # signals published one tile later: the same bits
        comm.synchronize()
        if not torch.equal(out, plain) or not err < 2e-2 or not same_on_all_ranks(ctx, out):
            bad.append((m, k, err))
        if not torch.equal(late, plain):
            bad.append((m, k, "defer"))
    deferred.close()
    op.close()
    if ctx.backend != "cuda":
        comm.free(reg)
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_gemm_overlap_registered_output(worlds, world):
    for bad in worlds(world).run(_job_gemm_registered, [(17, 40, 40), (48, 24, 40), (3, 32, 40)]):
        assert bad == []


def _job_gemm_graph(ctx, m, k, n, replays):
    """GPU: the overlapped path captured inside ``graph_capture`` (its graph-pool output registered on
    exit) and replayed with fresh inputs matches torch.distributed, equally on every rank, and the
    eager call into a regular output gives the same bits."""
    comm = make_comm(ctx, debug=False)
    op = GemmAllReduce(comm, max_tokens=m, n=n)
    x, w = _inputs(ctx, m, k, n, torch.bfloat16, 0)
    warm_up_for_capture(lambda: op(x, w, path="overlap"))
    used = comm.registered.used
    graph = torch.cuda.CUDAGraph()
    with comm.graph_capture():
        with torch.cuda.graph(graph):
            y = op(x, w, path="overlap")
    rows = [comm.registered.used - used == 1]
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(replays):
        x.copy_((torch.randn(m, k, generator=g) / k ** 0.5).to(torch.bfloat16))
        graph.replay()
        comm.synchronize()
        ref = reference_sum(ctx, x.float() @ w.float().t())
        eager = op(x, w, path="overlap")
        comm.synchronize()
        err = ((y.float().cpu() - ref).abs().max() / ref.abs().max()).item()
        rows.append(err < 2e-2 and same_on_all_ranks(ctx, y) and torch.equal(eager, y))
    del graph
    op.close()
    comm.close()
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_gemm_overlap_graph_replay(worlds, world):
    # 300 rows: three row blocks of 128 with a ragged last one; N = 1000: four column blocks, ragged
    for rows in worlds(world).run(_job_gemm_graph, 300, 1024, 1000, 4):
        assert all(rows), rows


def _job_gemm_mismatch(ctx):
    """Debug mode: ranks that pass different K (or different registered outputs) to the overlapped
    path get ``CollectiveMismatchError`` on every rank before any rank waits, and the op stays usable."""
    comm = make_comm(ctx, debug=True)
    op = GemmAllReduce(comm, max_tokens=16, n=32)
    d = ctx.device
    w = torch.ones(32, 16, dtype=torch.bfloat16, device=d)
    caught = []
    k = 16 if ctx.rank == 0 else 8
    try:
        op(torch.ones(4, k, dtype=torch.bfloat16, device=d), torch.ones(32, k, dtype=torch.bfloat16, device=d),
           path="overlap")
        comm.synchronize()
        caught.append(None)
    except tc.CollectiveMismatchError as e:
        caught.append(e.field)
    out = op(torch.ones(4, 16, dtype=torch.bfloat16, device=d), w, path="overlap")
    comm.synchronize()
    ok = bool((out.float().cpu() == 16 * ctx.world).all())
    op.close()
    comm.close()
    return caught, ok


def test_gemm_overlap_debug_mode_catches_mismatched_shapes(worlds):
    for caught, ok in worlds(2).run(_job_gemm_mismatch):
        assert caught == ["algorithm"], caught  # the (K, output row) word of the signature
        assert ok


def _job_switches(ctx):
    """The path switch points: the device table's (op ``gemm``), the declared defaults where it has
    none, and explicit arguments over both."""
    from tritoncomm.collectives import AllReduce, SelectionTable
    from tritoncomm.collectives.gemm import GEMM_SWITCHES

    comm = make_comm(ctx)
    plain = GemmAllReduce(comm, max_tokens=16, n=32)
    defaults = (plain.overlap_min_tokens, plain.chunked_min_tokens)
    packaged = plain.allreduce.table
    plain.close()
    table = packaged.merged(SelectionTable({}, "switches", switches={
        ("gemm", ctx.world): {"overlap_from_tokens": 7, "chunked_from_tokens": 3}}))
    ar = AllReduce(comm, max_bytes=16 * 32 * 2, table=table)
    tabled = GemmAllReduce(comm, max_tokens=16, n=32, allreduce=ar)
    explicit = GemmAllReduce(comm, max_tokens=16, n=32, allreduce=ar, overlap_min_tokens=None, chunked_min_tokens=5)
    got = {"defaults": defaults, "declared": tuple(GEMM_SWITCHES[k] for k in ("overlap_from_tokens",
                                                                              "chunked_from_tokens")),
           "table": (tabled.overlap_min_tokens, tabled.chunked_min_tokens),
           "paths": (tabled.select(2, 16), tabled.select(4, 16), tabled.select(8, 16)),
           "explicit": (explicit.overlap_min_tokens, explicit.chunked_min_tokens)}
    for op in (tabled, explicit):
        op.close()
    ar.close()
    comm.close()
    return got


def test_path_switches_come_from_the_table(worlds):
    for got in worlds(2).run(_job_switches):
        assert got["defaults"] == got["declared"], got
        assert got["table"] == (7, 3), got
        assert got["paths"] == ("plain", "chunked", "overlap"), got
        assert got["explicit"] == (None, 5), got
