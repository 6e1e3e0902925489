"""Collectives against torch.distributed on random data, at world 2, 3 and 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import tritoncomm as tc
from tritoncomm.collectives import Choice, SelectionTable

from ..conftest import BACKEND
from ..helpers import (
    bit_mismatches,
    check_close,
    dealt,
    make_comm,
    reference_sum,
    same_on_all_ranks,
    small_table,
    warm_up_for_capture,
    world_sizes,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ALGOS = list(tc.collectives.ALGORITHMS)


def _job_sizes(ctx, algo, dtype, sizes, inplace, programs=None):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, algos=(algo,))
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(7919 * n + ctx.rank)
        x = (torch.randn(n, generator=g) * 4).to(dtype).to(ctx.device)
        ref = reference_sum(ctx, x)
        if inplace:
            out = ar(x, out=x, algo=algo, programs=programs)
            assert out.data_ptr() == x.data_ptr()
        else:
            out = torch.full_like(x, float("nan"))  # poison
            ar(x, out=out, algo=algo, programs=programs)
        comm.synchronize()
        err = check_close(out, ref, dtype)
        rows.append((n, err, same_on_all_ranks(ctx, out)))
    ar.close()
    comm.close()
    return rows


@pytest.mark.parametrize("world,dtype", [(w, torch.bfloat16) for w in world_sizes(2, 3, 4)]
                         + dealt([torch.float16, torch.float32], 3, 4))
@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_matches_torch_distributed(worlds, world, algo, dtype):
    """Every algorithm against torch.distributed: bf16 at world 2, 3 and 4, fp16 at 3, fp32 at 4."""
    sizes = [1, 2, 3, 127, 1001, 4099, 20011 if algo in ("ll", "lamport") else 65537]
    for rows in worlds(world).run(_job_sizes, algo, dtype, sizes, False):
        for n, _err, identical in rows:
            assert identical, f"rank results differ at n={n}"


@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_capped_programs(worlds, algo):
    """``programs=1`` (fewer than the grid, as the GEMM's overlapped slices ask) still reduces every
    element, and the launch shape is the same on every rank."""
    for rows in worlds(3).run(_job_sizes, algo, torch.bfloat16, [1, 1001, 4099], False, 1):
        for n, err, identical in rows:
            assert identical and err < 5e-2, f"n={n}: err {err}, identical {identical}"


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_in_place(worlds, world, algo):
    results = worlds(world).run(_job_sizes, algo, torch.bfloat16, [1, 33, 5003], True)
    assert all(identical for rows in results for _, _, identical in rows)


def _job_table_driven(ctx, sizes, dtype):
    """Sizes on both sides of every boundary of ``small_table``; the algorithm comes from the table."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 18, table=small_table(ctx.world))
    picks, bad = [], []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n + 17 * ctx.rank)).to(dtype).to(ctx.device)
        out = torch.full_like(x, float("nan"))
        ar(x, out=out)
        comm.synchronize()
        picks.append(ar.select(x.numel() * x.element_size(), dtype))
        try:
            check_close(out, reference_sum(ctx, x), dtype)
        except AssertionError as e:
            bad.append((n, str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append((n, "ranks differ"))
    ar.close()
    comm.close()
    return picks, bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_odd_sizes_at_every_algorithm_boundary(worlds, world):
    # bf16 boundaries: 1K, 2K, 3K, 6K, 8K, 32K elements
    sizes = [1, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 6144, 6145, 8191, 8192, 8193, 32767, 32768, 32769,
             40001]
    results = worlds(world).run(_job_table_driven, sizes, torch.bfloat16)
    picks = results[0][0]
    assert picks == (["ll_twoshot"] * 3 + ["ll"] * 3 + ["lamport"] * 2 + ["lamport_twoshot"] * 2 + ["oneshot"] * 3
                     + ["twoshot"] * 5)
    for p, bad in results:
        assert p == picks and bad == []


def _job_repeated(ctx, calls, dtype):
    """Back-to-back calls of changing sizes (hence algorithms); each checked."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 18, table=small_table(ctx.world))
    g = torch.Generator().manual_seed(12345 + ctx.rank)
    sizes = torch.Generator().manual_seed(99)  # same sequence on every rank
    bad = []
    for i in range(calls):
        n = int(torch.randint(1, 20000, (1,), generator=sizes).item())
        x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
        out = torch.full_like(x, float("nan"))
        ar(x, out=out)
        comm.synchronize()
        try:
            check_close(out, reference_sum(ctx, x), dtype)
        except AssertionError as e:
            bad.append((i, n, ar.select(n * x.element_size(), dtype), str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append((i, n, "ranks differ"))
    ar.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_allreduce_repeated_calls(worlds, world):
    """100 calls on GPUs; in the CPU world (CI) 60 at world 2 and 30 at world 4."""
    calls = 100 if BACKEND == "cuda" else 60 if world < 4 else 30
    for bad in worlds(world).run(_job_repeated, calls, torch.bfloat16):
        assert bad == []


def _job_selection(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20)
    picks = [ar.select(b) for b in (2, 8 << 10, (64 << 10) + 2, 1 << 20, (1 << 20) + 2)]
    ar.close()
    comm.close()
    return picks


def test_selection_is_the_same_on_every_rank(worlds):
    picks = worlds(3).run(_job_selection)
    assert picks[0][-1] == "fallback"
    assert all(p == picks[0] for p in picks)


def _job_plan_follows_table(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=64 << 10, table=small_table(ctx.world))
    used: list[str] = []

    def spy(name, launch):
        def counted(*args):
            used.append(name)
            launch(*args)
        return counted

    for name in ar.algorithms:
        a = ar.algorithm(name)
        a.launch = spy(name, a.launch)
    x = torch.randn(1500, generator=torch.Generator().manual_seed(ctx.rank)).to(torch.bfloat16).to(ctx.device)
    ref = reference_sum(ctx, x)
    outs = [ar(x), ar(x)]  # 3000 bytes: the LL one-shot's row, then its kept plan
    rows = {("allreduce", ctx.world, d): [(1 << 40, Choice("oneshot", 2, 512, 1))] for d in ("bf16", "fp16", "fp32")}
    ar.table = SelectionTable(rows, "all one-shot")  # what tune does between candidates
    outs.append(ar(x))
    for out in outs:
        check_close(out, ref, torch.bfloat16)
    ar.close()
    comm.close()
    return used


def test_kept_plans_follow_a_replaced_table(worlds):
    for used in worlds(2).run(_job_plan_follows_table):
        assert used == ["ll", "ll", "oneshot"]


def _job_fallback(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=4096, fallback_group=ctx.group)
    x = torch.randn(5000, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    out = ar(x)
    comm.synchronize()
    check_close(out, reference_sum(ctx, x), torch.float32)
    picked = ar.select(x.numel() * 4)
    ar.close()
    comm.close()
    return picked


def test_too_large_falls_back_to_torch_distributed(worlds, caplog):
    assert worlds(2).run(_job_fallback) == ["fallback", "fallback"]


def _job_gather_scatter(ctx, dtype, ms):
    comm = make_comm(ctx)
    ag = tc.AllGather(comm, max_bytes=1 << 20)
    rs = tc.ReduceScatter(comm, max_bytes=1 << 20)
    w = ctx.world
    bad = []
    for m in ms:
        x = torch.randn(m, generator=torch.Generator().manual_seed(m + 101 * ctx.rank)).to(dtype).to(ctx.device)
        out = torch.full((w * m,), float("nan"), dtype=dtype, device=ctx.device)
        ag(x, out)
        comm.synchronize()
        ref = [torch.empty_like(x.cpu()) for _ in range(w)]
        dist.all_gather(ref, x.cpu(), group=ctx.cpu_group)
        if not torch.equal(out.cpu(), torch.cat(ref)):
            bad.append(("allgather", m))
        big = torch.randn(w * m, generator=torch.Generator().manual_seed(m + 7 * ctx.rank)).to(dtype).to(ctx.device)
        red = torch.full((m,), float("nan"), dtype=dtype, device=ctx.device)
        rs(big, red)
        comm.synchronize()
        full = reference_sum(ctx, big)
        try:
            check_close(red, full[ctx.rank * m:(ctx.rank + 1) * m], dtype)
        except AssertionError as e:
            bad.append(("reducescatter", m, str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append(("allgather differs between ranks", m))
    ag.close()
    rs.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_and_reducescatter(worlds, world, dtype):
    for bad in worlds(world).run(_job_gather_scatter, dtype, [1, 7, 1000, 4097]):
        assert bad == []


def _job_alltoall(ctx, dtype, ms):
    """``AllToAll`` against gloo's ``all_to_all_single`` on random data, outputs poisoned, repeated
    calls at odd and even shard sizes, 2-D inputs, and a fallback past ``max_bytes``."""
    comm = make_comm(ctx)
    a2a = tc.AllToAll(comm, max_bytes=1 << 20, fallback_group=ctx.group)  # the device's group (gloo or NCCL)
    w = ctx.world
    bad = []
    for rep in range(2):
        for m in ms:
            g = torch.Generator().manual_seed(m + 101 * ctx.rank + 7 * rep)
            x = torch.randn(w * m, generator=g).to(dtype)
            if m % 2 == 0:
                x = x.view(w * 2, m // 2)  # rows: shard s is rows [2s, 2s + 2)
            out = torch.full(x.shape, float("nan"), dtype=dtype, device=ctx.device)
            a2a(x.to(ctx.device), out)
            comm.synchronize()
            ref = torch.empty_like(x)
            dist.all_to_all_single(ref, x, group=ctx.cpu_group)
            if not torch.equal(out.cpu(), ref):
                bad.append(("alltoall", m, rep))
    return bad + _alltoall_edges(ctx, comm, a2a)


def _alltoall_edges(ctx, comm, a2a):
    """Past ``max_bytes`` (the fallback group's answer), an input that does not split into equal
    shards (refused before any rank waits), a new output when none is given; then closed."""
    w, bad = ctx.world, []
    m = (1 << 20) // 2 // w + 1  # bf16: past 1 MiB in all
    x = torch.randn(w * m, generator=torch.Generator().manual_seed(ctx.rank)).to(torch.bfloat16)
    ref = torch.empty_like(x)
    dist.all_to_all_single(ref, x, group=ctx.cpu_group)
    if not torch.equal(a2a(x.to(ctx.device)).cpu(), ref) or a2a.max_bytes != 1 << 20:
        bad.append("fallback")
    try:
        a2a(torch.ones(w + 1, device=ctx.device))
        bad.append("an uneven input did not raise")
    except tc.InvalidInputError:
        pass
    a2a.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall_matches_torch_distributed(worlds, world, dtype):
    for bad in worlds(world).run(_job_alltoall, dtype, [1, 6, 1000, 4097]):
        assert bad == []


def _job_two_groups_two_streams(ctx, rounds):
    """Two communicators (two groups over the same ranks) and two all-reduces on one of them,
    used alternately; each result checked. Signal slots are never shared, so nothing mixes up."""
    group_b = dist.new_group(backend="gloo")
    comm_a = make_comm(ctx)
    comm_b = tc.Communicator(group_b, config=tc.CommConfig(timeout_s=30))
    ar_a1 = tc.AllReduce(comm_a, max_bytes=1 << 18, table=small_table(ctx.world))
    ar_a2 = tc.AllReduce(comm_a, max_bytes=1 << 18, table=small_table(ctx.world), name="second")
    ar_b = tc.AllReduce(comm_b, max_bytes=1 << 18, table=small_table(ctx.world))
    cuda = ctx.backend == "cuda"
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if cuda else [None, None]
    bad = []
    for i in range(rounds):
        n = [100, 3000, 9000][i % 3]
        xs = [torch.randn(n, generator=torch.Generator().manual_seed(i * 10 + k + 100 * ctx.rank)).to(ctx.device)
              for k in range(3)]
        outs = [torch.full_like(x, float("nan")) for x in xs]
        for k, (ar, x, out) in enumerate(zip((ar_a1, ar_a2, ar_b), xs, outs, strict=True)):
            if cuda:
                s = streams[k % 2]
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    ar(x, out=out)
            else:
                ar(x, out=out)
        if cuda:
            torch.cuda.synchronize()
        for k, (x, out) in enumerate(zip(xs, outs, strict=True)):
            try:
                check_close(out, reference_sum(ctx, x), torch.float32)
            except AssertionError as e:
                bad.append((i, k, str(e)))
    comm_a.check()
    comm_b.check()
    for obj in (ar_a1, ar_a2, ar_b, comm_a, comm_b):
        obj.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_two_groups_and_two_streams_do_not_share_slots(worlds, world):
    for bad in worlds(world).run(_job_two_groups_two_streams, 12):
        assert bad == []


def _replay_fresh(ctx, comm, graph, x: torch.Tensor, out: torch.Tensor, replays: int) -> list:
    """Replay ``graph`` ``replays`` times, each with fresh random ``x`` and a poisoned ``out``: per
    replay, (error against torch.distributed, bits identical on every rank)."""
    rows = []
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(replays):
        x.copy_(torch.randn(x.numel(), generator=g).to(x.dtype))
        out.fill_(float("nan"))
        graph.replay()
        comm.synchronize()
        rows.append((check_close(out, reference_sum(ctx, x), x.dtype), same_on_all_ranks(ctx, out)))
    return rows


def _job_graph_replay(ctx, algo, n, replays):
    """Capture three calls in a CUDA graph; replay with fresh data in the same buffers."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 22, algos=(algo,))
    x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
    out = torch.empty_like(x)
    warm_up_for_capture(lambda: ar(x, out=out, algo=algo))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            ar(x, out=out, algo=algo)
    rows = _replay_fresh(ctx, comm, graph, x, out, replays)
    del graph
    ar.close()
    comm.close()
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
@pytest.mark.parametrize("algo", ALGOS)
def test_graph_capture_and_replay_with_fresh_data(worlds, world, algo):
    n = 4099 if algo == "ll" else 1_000_003
    for rows in worlds(world).run(_job_graph_replay, algo, n, 10):
        assert all(same for _, same in rows)


def _job_widest_twoshot(ctx, programs: int, block: int, n: int, replays: int):
    """The two-shot at a barrier grid the tune may pick (``tools.tune.MAX_BARRIER_PROGRAMS`` programs
    of 8 warps), chosen by a table as the packaged one does: once eager into a poisoned output, then
    captured in a CUDA graph and replayed with fresh data."""
    comm = make_comm(ctx)
    table = SelectionTable({("allreduce", ctx.world, d): [(1 << 40, Choice("twoshot", programs, block, 8))]
                            for d in ("bf16", "fp16", "fp32")}, "test")
    ar = tc.AllReduce(comm, max_bytes=2 * n, table=table)
    x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    ar(x, out=out)
    comm.synchronize()
    rows = [(check_close(out, reference_sum(ctx, x), torch.bfloat16), same_on_all_ranks(ctx, out))]
    warm_up_for_capture(lambda: ar(x, out=out))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ar(x, out=out)
    rows += _replay_fresh(ctx, comm, graph, x, out, replays)
    del graph
    ar.close()
    comm.close()
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
@pytest.mark.parametrize("block", [2048, 4096])
def test_widest_barrier_grid_twoshot_matches_torch_distributed(worlds, world, block):
    """128 programs x 8 warps (the caps) on an odd message of about 17 MB (four rounds at world 2 with
    blocks of 2048, one elsewhere; a ragged last block): every rank's result within the dtype's
    tolerance of torch.distributed and bit-identical."""
    from tritoncomm.tools.tune import MAX_BARRIER_PROGRAMS, MAX_BARRIER_WARPS

    assert MAX_BARRIER_PROGRAMS * 8 <= MAX_BARRIER_WARPS
    for rows in worlds(world).run(_job_widest_twoshot, MAX_BARRIER_PROGRAMS, block, 8_388_617, 4):
        assert all(same for _, same in rows)


def _job_symmetric_tensors(ctx, sizes):
    """Inputs and outputs made by ``comm.empty``: with a symmetric output the two-shot writes peers'
    outputs in place of its all-gather buffer; a symmetric input is pushed like a regular one. The
    bits equal the staged path's in every combination, in place too."""
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, algos=("twoshot",))
    n_max = max(sizes)
    xs, outs = comm.empty(n_max, torch.bfloat16), comm.empty((n_max,), torch.bfloat16)
    bad = []
    if comm.heap_offset(xs) is None or comm.heap_offset(torch.empty(4, device=ctx.device)) is not None:
        bad.append("heap_offset")
    for it, n in enumerate(sizes):
        g = torch.Generator().manual_seed(31 * it + ctx.rank)
        data = torch.randn(n, generator=g).to(torch.bfloat16).to(ctx.device)
        staged = ar(data, algo="twoshot")  # regular tensors: the staged path
        x, out = xs[:n], outs[:n]
        for mode in ("x", "out", "both", "in-place"):
            x.copy_(data)
            dst = {"x": torch.full_like(data, float("nan")), "out": out, "both": out, "in-place": x}[mode]
            src = x if mode != "out" else data
            if mode in ("out", "both"):
                out.fill_(float("nan"))
            ar(src, out=dst, algo="twoshot")
            comm.synchronize()
            bad += bit_mismatches(ctx, dst, staged, (n, mode))
        check_close(staged, reference_sum(ctx, data), torch.bfloat16)
    try:
        comm.free(torch.empty(4))
        bad.append("free of a foreign tensor did not raise")
    except tc.InvalidInputError:
        pass
    comm.free(outs)
    comm.free(xs)
    ar.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_symmetric_tensors_zero_copy_twoshot(worlds, world):
    for bad in worlds(world).run(_job_symmetric_tensors, [4099, 1001, 40000, 7]):
        assert bad == []


def _job_symmetric_mismatch(ctx):
    """Debug mode: one rank passing a symmetric output where another passes a plain one (or another
    offset) would make the zero-copy two-shot write the wrong memory; it raises on every rank."""
    comm = make_comm(ctx, debug=True)
    ar = tc.AllReduce(comm, max_bytes=1 << 16, algos=("twoshot",))
    a, b = comm.empty(4096, torch.bfloat16), comm.empty(4096, torch.bfloat16)
    plain = torch.ones(4096, dtype=torch.bfloat16, device=ctx.device)
    a.fill_(1.0)
    b.fill_(1.0)
    fields = []
    for mine in ((a if ctx.rank == 0 else torch.empty_like(plain)), (a if ctx.rank == 0 else b)):
        try:
            ar(plain, out=mine, algo="twoshot")
            comm.synchronize()
            fields.append(None)
        except tc.CollectiveMismatchError as e:
            fields.append(e.field)
    out = ar(a, algo="twoshot")  # the same symmetric tensor everywhere: fine
    comm.synchronize()
    ok = bool((out.float().cpu() == ctx.world).all())
    comm.free(b)
    comm.free(a)
    ar.close()
    comm.close()
    return fields, ok


def test_debug_mode_catches_symmetric_tensor_mismatch(worlds):
    for fields, ok in worlds(2).run(_job_symmetric_mismatch):
        assert fields == ["algorithm", "algorithm"]
        assert ok


def _job_twoshot_rounds(ctx, sizes):
    """The two-shot in rounds (copy-out of round c-1 overlapping round c's pushes) gives the bits of
    the one-round form, staged and zero-copy, out of place and in place, call after call."""
    comm = make_comm(ctx)

    def table(rounds: int | None) -> SelectionTable:  # the launch shape with its rounds (None: by size)
        return SelectionTable({("allreduce", ctx.world, d): [(1 << 40, Choice("twoshot", 2, 512, 1, rounds))]
                               for d in ("bf16", "fp16", "fp32")}, f"test rounds={rounds}")

    ar = tc.AllReduce(comm, max_bytes=1 << 20, algos=("twoshot",), table=table(None))
    hx = comm.empty(max(sizes), torch.bfloat16)
    bad = []
    for it, n in enumerate(sizes):
        g = torch.Generator().manual_seed(17 * it + ctx.rank)
        data = (torch.randn(n, generator=g) * 3).to(torch.bfloat16).to(ctx.device)
        ar.table = table(1)
        base = ar(data)
        comm.synchronize()
        check_close(base, reference_sum(ctx, data), torch.bfloat16)
        for rounds in (None, 2, 3, 4):  # None: the size rule (4 rounds from 16 blocks per program)
            ar.table = table(rounds)
            for call in range(2):
                out = torch.full_like(data, float("nan"))
                ar(data, out=out)
                x = hx[:n]
                x.copy_(data)
                ar(x, out=x)  # a symmetric tensor in place (no copy-out)
                comm.synchronize()
                for what, t in (("staged", out), ("heap in place", x)):
                    bad += bit_mismatches(ctx, t, base, (n, rounds, call, what))
    comm.free(hx)
    ar.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(3))
def test_twoshot_rounds_match_one_round(worlds, world):
    for bad in worlds(world).run(_job_twoshot_rounds, [40000, 4099, 7]):
        assert bad == []
