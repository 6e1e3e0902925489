"""Registered outputs: the two-shot all-reduce writing peers' regular tensors directly.

CPU world: only heap tensors can be registered, so these tests register ``comm.empty`` tensors;
the kernel path (stores through the table row, no copy-out) and the host side (slots, rows,
checks) are the ones the GPU world uses with IPC-mapped regular tensors (``gpu`` tests below)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import tritoncomm as tc

from ..conftest import BACKEND
from ..helpers import (
    bit_mismatches,
    check_close,
    make_comm,
    reference_sum,
    same_on_all_ranks,
    warm_up_for_capture,
    world_sizes,
)


def _registrable(ctx, comm, n: int) -> torch.Tensor:
    """A regular tensor on GPUs, a heap tensor in the CPU world."""
    if ctx.backend == "cuda":
        return torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
    return comm.empty(n, torch.bfloat16)


def _job_registered(ctx, sizes):
    """Out of place and in place through a registered output: the bits of the staged path, on every
    rank, call after call; the row lists every rank's tensor."""
    comm = make_comm(ctx, debug=True)  # debug: every call also compares the slot across ranks
    ar = tc.AllReduce(comm, max_bytes=1 << 20, algos=("twoshot",))
    n_max = max(sizes)
    out, io = _registrable(ctx, comm, n_max), _registrable(ctx, comm, n_max)
    bad = []
    if comm.peer_row(out) is not None:
        bad.append("row before registration")
    comm.register(out, io)
    row = comm.peer_row(out)
    if row is None or comm.peer_row(io) is None:
        bad.append("no row after registration")
    else:
        listed = comm.registered.table[comm.peer_slot(row)].cpu().tolist()
        every: list = [None] * ctx.world
        torch.distributed.all_gather_object(every, out.data_ptr(), group=ctx.cpu_group)
        if listed[ctx.rank] != out.data_ptr():
            bad.append(("own address", listed, out.data_ptr()))
        if ctx.backend == "cpu":  # heap tensors: peers see them at their heap base + the same offset
            off = comm.heap_offset(out)
            want = [comm.heap.memory.peer_addrs[p] + off for p in range(ctx.world)]
            if listed != want:
                bad.append(("row", listed, want))
    for it, n in enumerate(sizes):
        g = torch.Generator().manual_seed(101 * it + ctx.rank)
        data = (torch.randn(n, generator=g) * 3).to(torch.bfloat16).to(ctx.device)
        staged = ar(data, algo="twoshot")
        for call in range(2):
            o = out[:n]
            o.fill_(float("nan"))  # poison
            ar(data, out=o, algo="twoshot")
            x = io[:n]
            x.copy_(data)
            ar(x, out=x, algo="twoshot")  # in place
            comm.synchronize()
            bad += bit_mismatches(ctx, o, staged, (n, call, "registered"))
            bad += bit_mismatches(ctx, x, staged, (n, call, "registered in place"))
        check_close(staged, reference_sum(ctx, data), torch.bfloat16)
    ar.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_registered_output_gives_the_staged_bits(worlds, world):
    for bad in worlds(world).run(_job_registered, [4099, 40000, 7, 1001]):
        assert bad == []


def _job_register_errors(ctx):
    comm = make_comm(ctx)
    got = []
    for what, call in (
        ("non-contiguous", lambda: comm.register(_registrable(ctx, comm, 64)[::2])),
        ("count", lambda: comm.register(*[_registrable(ctx, comm, 64)] * (1 + ctx.rank))),
        ("misaligned", lambda: comm.register(_registrable(ctx, comm, 64)[1:])),
    ):
        try:
            call()
            got.append((what, None))
        except tc.TritonCommError as e:
            got.append((what, type(e).__name__))
    if ctx.backend == "cpu":  # a private tensor cannot be mapped into another process
        try:
            comm.register(torch.empty(64, dtype=torch.bfloat16))
            got.append(("private", None))
        except tc.InvalidInputError as e:
            got.append(("private", "heap" in str(e)))
        try:
            with comm.graph_capture():
                pass
            got.append(("graph_capture", None))
        except tc.TritonCommError:
            got.append(("graph_capture", True))
    comm.close()
    return got


def test_register_rejects_bad_tensors_on_every_rank(worlds):
    for got in worlds(2).run(_job_register_errors):
        assert got[:3] == [("non-contiguous", "InvalidInputError"), ("count", "SetupMismatchError"),
                           ("misaligned", "InvalidInputError")]
        assert got[3:] == ([] if BACKEND == "cuda" else [("private", True), ("graph_capture", True)])


def _job_reserve_commit(ctx):
    """The deferred path's bookkeeping (what ``graph_capture`` does around a capture): reserved slots
    get their rows on commit, in reservation order; the table runs out with a clear error."""
    comm = make_comm(ctx, registered_slots=4)
    reg = comm.registered
    a, b = comm.empty(256, torch.bfloat16), comm.empty(512, torch.bfloat16)
    slots = [reg.reserve(a.data_ptr()), reg.reserve(b.data_ptr()), reg.reserve(a.data_ptr() + 2)]
    before = reg.table.clone()
    n = reg.commit()
    rows = [reg.table[s].tolist() for s in slots[:2]]
    want = [[comm.heap.memory.peer_addrs[p] + comm.heap_offset(t) for p in range(ctx.world)] for t in (a, b)]
    err = None
    try:
        reg.register([a, b, a])  # 2 slots left
    except tc.InvalidInputError as e:
        err = str(e)
    comm.close()
    return slots, n, bool((before == 0).all()), rows == want, err


def test_reserved_slots_get_rows_on_commit(worlds):
    for slots, n, empty_before, rows_ok, err in worlds(2).run(_job_reserve_commit):
        assert slots == [0, 1, None]  # a misaligned address takes no slot
        assert n == 2 and empty_before and rows_ok
        assert err is not None and "slots" in err


def _job_graph_capture(ctx, n, replays):
    """GPU: graphs captured inside ``graph_capture`` write peers' graph-pool outputs directly; replays
    with fresh data match torch.distributed and are equal on every rank."""
    comm = make_comm(ctx, debug=False)
    ar = tc.AllReduce(comm, max_bytes=1 << 24, algos=("twoshot",))
    x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
    warm_up_for_capture(lambda: ar(x, algo="twoshot"))
    used = comm.registered.used
    graph = torch.cuda.CUDAGraph()
    with comm.graph_capture():
        with torch.cuda.graph(graph):
            y = ar(x, algo="twoshot")  # output from the graph's pool
            z = ar(y, algo="twoshot")  # a second call, its input the first's output
            ar(z, out=z, algo="twoshot")  # in place
    taken = comm.registered.used - used
    rows = []
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(replays):
        x.copy_(torch.randn(n, generator=g).to(torch.bfloat16))
        graph.replay()
        comm.synchronize()
        ry = reference_sum(ctx, x)
        rows.append((check_close(y, ry, torch.bfloat16), same_on_all_ranks(ctx, y), same_on_all_ranks(ctx, z)))
        zz = ar(ar(x.clone()))  # eager, staged: the same bits
        zz = ar(zz, out=zz)
        comm.synchronize()
        rows.append((0.0, torch.equal(zz, z), True))
    del graph
    ar.close()
    comm.close()
    return taken, rows


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_graph_capture_registers_graph_outputs(worlds, world):
    for taken, rows in worlds(world).run(_job_graph_capture, 1_000_003, 5):
        assert taken == 3
        assert all(a and b for _, a, b in rows)


def _job_engine_capture(ctx, replays):
    """GPU: vLLM's contract. Graphs captured inside ``capture()`` (as the engines capture all theirs)
    get the outputs of the algorithms that store into peers' outputs registered; replays with fresh
    data match torch.distributed. The size is the smallest power of two from 1 MB that the engine's
    table sends to such an algorithm (the two-shot: 32 MB on H100s and H200s at TP2 and TP4; the
    Lamport paths below that write no peer output)."""
    from tritoncomm.collectives.allreduce.twoshot import TwoShot
    from tritoncomm.integrations import TritonCommCustomAllreduce

    ca = TritonCommCustomAllreduce(ctx.cpu_group, ctx.device, max_size=64 << 20)
    sizes = [1 << k for k in range(20, 27)]
    nbytes = next((b for b in sizes if ca.ar.select(b) == TwoShot.name), None)
    if nbytes is None:
        ca.close()
        return None, [f"no size of {sizes} takes the two-shot: {[ca.ar.select(b) for b in sizes]}"]
    n = nbytes // 2
    x = torch.randn(n, device=ctx.device).to(torch.bfloat16)
    warm_up_for_capture(lambda: ca.custom_all_reduce(x))
    graph = torch.cuda.CUDAGraph()
    used = ca.comm.registered.used
    with ca.capture():
        with torch.cuda.graph(graph):
            y = ca.custom_all_reduce(x)
    taken = ca.comm.registered.used - used
    ok = []
    g = torch.Generator().manual_seed(3 + ctx.rank)
    for _ in range(replays):
        x.copy_(torch.randn(n, generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        check_close(y, reference_sum(ctx, x), torch.bfloat16)
        ok.append(same_on_all_ranks(ctx, y))
    del graph
    ca.close()
    return taken, ok


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_engine_capture_registers_graph_outputs(worlds, world):
    for taken, ok in worlds(world).run(_job_engine_capture, 4):
        assert taken == 1 and all(ok), ok


def _job_allgather_direct(ctx, shards):
    """The direct all-gather into a registered output: the staged path's bits on every rank, call
    after call (the entry barrier keeps a fast peer's stores out of a tensor still being read)."""
    comm = make_comm(ctx, debug=True)
    ag = tc.AllGather(comm, max_bytes=1 << 20)
    w = ctx.world
    out = _registrable(ctx, comm, w * max(shards))
    comm.register(out)
    bad = []
    for it, m in enumerate(shards):
        g = torch.Generator().manual_seed(13 * it + ctx.rank)
        x = torch.randn(m, generator=g).to(torch.bfloat16).to(ctx.device)
        staged = ag(x)
        for call in range(3):
            o = out[:w * m]
            o.fill_(float("nan"))
            ag(x, o, direct=True)
            comm.synchronize()
            bad += bit_mismatches(ctx, o, staged, (m, call, "direct"))
            o.add_(1)  # the next call's peers must not store before this rank is done with the tensor
        ag.DIRECT_FROM, ag.DIRECT_MIN_BYTES = {}, 0  # the size rule picks the direct form for this tensor
        rows = []
        comm.peer_row = lambda t, real=comm.peer_row, rows=rows: rows.append(real(t)) or rows[-1]
        o = out[:w * m]
        o.fill_(float("nan"))
        ag(x, o)
        comm.synchronize()
        bad += bit_mismatches(ctx, o, staged, (m, "by size"))
        if len(rows) != 1 or not rows[0]:
            bad.append(("by size: no registered row looked up", rows))
        del ag.DIRECT_FROM, ag.DIRECT_MIN_BYTES, comm.peer_row
    try:
        ag(torch.ones(8, dtype=torch.bfloat16, device=ctx.device), direct=True)  # not registered
        bad.append("direct=True on an unregistered output did not raise")
    except tc.InvalidInputError:
        pass
    ag.close()
    comm.close()
    return bad


def _job_alltoall_direct(ctx, shards):
    """The direct all-to-all into a registered output: the staged path's bits on every rank, call
    after call (the entry barrier keeps a fast peer's stores out of a tensor still being read)."""
    comm = make_comm(ctx, debug=True)
    a2a = tc.AllToAll(comm, max_bytes=1 << 20)
    w = ctx.world
    out = _registrable(ctx, comm, w * max(shards))
    comm.register(out)
    bad = []
    for it, m in enumerate(shards):
        g = torch.Generator().manual_seed(17 * it + ctx.rank)
        x = torch.randn(w * m, generator=g).to(torch.bfloat16).to(ctx.device)
        staged = a2a(x)
        for call in range(3):
            o = out[:w * m]
            o.fill_(float("nan"))
            a2a(x, o, direct=True)
            comm.synchronize()
            if not torch.equal(o.view(torch.int16).cpu(), staged.view(torch.int16).cpu()):  # each rank its own
                bad.append((m, call, "direct differs from staged"))
            o.add_(1)  # the next call's peers must not store before this rank is done with the tensor
    try:
        a2a(torch.ones(2 * w, dtype=torch.bfloat16, device=ctx.device), direct=True)  # not registered
        bad.append("direct=True on an unregistered output did not raise")
    except tc.InvalidInputError:
        pass
    a2a.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_direct_alltoall_gives_the_staged_bits(worlds, world):
    for bad in worlds(world).run(_job_alltoall_direct, [1001, 7, 4096]):
        assert bad == []


def _job_alltoall_graph(ctx, m, replays):
    """GPU: all-to-alls captured in a CUDA graph (staged into a regular output, and direct into one
    ``graph_capture`` registers), replayed with fresh data: each equals torch.distributed's
    ``all_to_all_single`` of the same data (over gloo)."""
    comm = make_comm(ctx, debug=False)
    a2a = tc.AllToAll(comm, max_bytes=1 << 24)
    w = ctx.world
    x = torch.randn(w * m, device=ctx.device).to(torch.bfloat16)
    staged = torch.empty_like(x)
    warm_up_for_capture(lambda: a2a(x, staged))
    graph = torch.cuda.CUDAGraph()
    with comm.graph_capture():
        with torch.cuda.graph(graph):
            a2a(x, staged)
            direct = torch.empty_like(x)  # from the graph's pool: registered on exit, peers store into it
            a2a(x, direct, direct=True)
    g, ok = torch.Generator().manual_seed(ctx.rank), []
    for _ in range(replays):
        x.copy_(torch.randn(w * m, generator=g).to(torch.bfloat16))
        staged.fill_(float("nan"))
        graph.replay()
        comm.synchronize()
        want = torch.empty_like(x.cpu())
        dist.all_to_all_single(want, x.cpu(), group=ctx.cpu_group)
        ok.append(torch.equal(staged.cpu(), want) and torch.equal(direct.cpu(), want))
    del graph
    a2a.close()
    comm.close()
    return ok


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_alltoall_graph_replays_with_fresh_data(worlds, world):
    for ok in worlds(world).run(_job_alltoall_graph, 250_007, 5):
        assert ok == [True] * 5, ok


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_direct_allgather_gives_the_staged_bits(worlds, world):
    for bad in worlds(world).run(_job_allgather_direct, [1001, 4096, 7, 20000]):
        assert bad == []
