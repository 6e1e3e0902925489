"""Which MoE dispatch path a call takes (one kernel, send and gather, routed, direct; decode calls on
large instances, bounds, the one-kernel limit), the heap each path uses against its bound, and traced
builds: every call still exact against the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tritoncomm.collectives.moe import NEVER, SHAPES, MoEAllToAll

from ..helpers import dealt, make_comm, world_sizes
from .moejob import job


def _paths(ctx):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    small = replace(SHAPES["cpu"], programs=1)
    got = []
    for tokens, shape, decode in ((4, None, None), (400, replace(SHAPES["cpu"], route_above=4), small),
                                  (400, replace(SHAPES["cpu"], route_above=1 << 16), small),
                                  (400, replace(SHAPES["cpu"], one_kernel=False, route_above=4), None),
                                  (400, replace(SHAPES["cpu"], route_above=4, direct_from_bytes=340 * 40 * 2), small)):
        moe = MoEAllToAll(comm, max_tokens=tokens, hidden=40, num_experts=4 * ctx.world, top_k=3, shape=shape,
                          decode_shape=decode, decode_below=8)
        got.append([(path, sh is moe.decode_shape) for path, sh in (moe.dispatch_path(), moe.dispatch_path(5),
                                                                     moe.dispatch_path(300), moe.dispatch_path(350))])
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2))
def test_dispatch_path_names_the_kernels_a_call_launches(worlds, world):
    """``MoEAllToAll.dispatch_path`` (no bound; a bound of 5 tokens, of 300 and of 350, top-3, at most
    1024 entries in one kernel in the CPU world): a decode-sized instance always one kernel; a large
    routed one the route and send kernels, but one kernel with the decode shape for 5 tokens and with
    its own for 300; a large one under ``route_above`` the send and gather kernels likewise; with
    ``one_kernel=False`` never one kernel; with ``direct_from_bytes`` 340 x 40 x 2 the routed calls of at least 340
    tokens (no bound: 400) into the peers' slots."""
    one = [("one-kernel", True), ("one-kernel", False)]
    for got in worlds(world).run(_paths):
        assert got == [[("one-kernel", False)] * 4, [("routed", False), *one, ("routed", False)],
                       [("send-gather", False), *one, ("send-gather", False)], [("routed", False)] * 4,
                       [("routed-direct", False), *one, ("routed-direct", False)]]


def _direct_paths(ctx):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    shape = replace(SHAPES["cpu"], route_above=4, direct_from_bytes=400 * 128 + 1)
    got = []
    for fp8 in (False, True):
        moe = MoEAllToAll(comm, max_tokens=400, hidden=128, num_experts=4 * ctx.world, top_k=3, shape=shape,
                          fp8_dispatch=fp8)
        experts = moe.buffers()["experts"]
        got.append((moe.dispatch_path()[0], moe.dispatch_path(399)[0], comm.heap_offset(experts) is not None))
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2))
def test_direct_switch_counts_bytes_on_the_wire(worlds, world):
    """``direct_from_bytes`` counts a call's rows in bytes on the wire: 400 tokens of hidden 128 are
    102400 bytes in bf16 and 51200 with FP8 dispatch, so a switch at 51201 sends the bf16 rows
    straight into the peers' slots (and puts that instance's expert buffer in the heap), not the
    FP8 ones; a bound of 399 tokens is 102144 bytes, still direct in bf16."""
    for got in worlds(world).run(_direct_paths):
        assert got == [("routed-direct", "routed-direct", True), ("routed", "routed", False)]


def _heap_use(ctx):
    from tritoncomm.collectives.moe import heap_bytes_bound

    comm = make_comm(ctx, heap_bytes=64 << 20)
    cpu = SHAPES["cpu"]
    cases = [dict(max_tokens=6), dict(max_tokens=400, shape=replace(cpu, route_above=4)),
             dict(max_tokens=400, shape=replace(cpu, route_above=4, direct_from_bytes=0), fp8_dispatch=True),
             dict(max_tokens=400, shape=replace(cpu, route_above=4, packets=True, routed_packets=True)),
             dict(max_tokens=400, shape=replace(cpu, one_kernel=False, route_above=1 << 16), mode="throughput"),
             dict(max_tokens=40, capacity=7, fp8_dispatch=True, mode="latency"),
             dict(max_tokens=40, shape=replace(cpu, packets=True), dtype=torch.float16)]
    got = []
    for case in cases:
        before = comm.heap.allocator.used_bytes
        moe = MoEAllToAll(comm, hidden=128, num_experts=4 * ctx.world, top_k=3, **case)
        used = comm.heap.allocator.used_bytes - before
        kw = {k: v for k, v in case.items() if k != "mode"}
        got.append((used, heap_bytes_bound(comm.backend, comm.device, ctx.world, hidden=128,
                                           num_experts=4 * ctx.world, top_k=3, **kw)))
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_heap_bytes_bound_holds_every_path(worlds, world):
    """``heap_bytes_bound`` (what an engine sizes a communicator by) is at least what an instance
    takes from the heap on every path (one kernel, routed, routed into the peers' slots with FP8,
    routed packets, send + gather, a capacity of its own, packets in fp16), and not more than a few
    MiB plus three times it."""
    for got in worlds(world).run(_heap_use):
        for used, bound in got:
            assert used <= bound <= 3 * used + (4 << 20), got


@pytest.mark.parametrize("world,routing", dealt(["held", "routed", "routed-direct", "routed-packets"], 3, 2))
def test_decode_calls_on_large_instances_take_one_kernel(worlds, world, routing):
    """An instance sized for more routing entries than one kernel holds (400 tokens of top-3), called
    with at most 5 tokens: calls given ``tokens_bound`` (every other one) dispatch in one kernel,
    the others through the send and gather (``held``) or route and send (``routed``; with
    ``routed-packets`` both on the same packet buffers; with ``routed-direct`` into the peers'
    expert slots, between one-kernel calls that lay out the same buffer) kernels, on the same
    buffers; every call exact."""
    if routing == "held" and worlds(world).backend == "cuda":
        pytest.skip("a send program would hold 2048 routing entries: GPUs hold at most ONE_KERNEL_ENTRIES")
    shape = replace(SHAPES["cpu"], route_above=1 << 16) if routing == "held" else \
        replace(SHAPES["cpu"], route_above=4, routed_packets=routing == "routed-packets",
                direct_from_bytes=0 if routing == "routed-direct" else NEVER)
    for bad in worlds(world).run(job, 4 * world, 3, 24, 400, "hot", 4, capacity=6, mode="throughput", shape=shape,
                                 call_tokens=5, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,mode,instance", dealt([("latency", "routed"), ("throughput", "routed"),
                                                        ("throughput", "one-kernel"), ("latency", "one-kernel")],
                                                       3, 2))
def test_decode_calls_on_large_instances_launch_narrower(worlds, world, mode, instance):
    """As above (``routed``; ``one-kernel``: an instance of 40 tokens, whose every call takes one
    kernel), the calls given ``tokens_bound`` launching their dispatch and combine with
    ``decode_shape``, 2 programs of the channels' 3 (one sending, one laying out), the others with
    all 3: every program of a wide launch must find the epoch (the tables' half) that the narrow one
    left, and every call is exact."""
    shape = replace(SHAPES["cpu"], programs=3, route_above=4)
    tokens = 400 if instance == "routed" else 40
    for bad in worlds(world).run(job, 4 * world, 3, 24, tokens, "hot", 5, capacity=6, mode=mode, shape=shape,
                                 call_tokens=5, bound_odd=True, decode_shape=replace(SHAPES["cpu"], programs=2)):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2))
def test_decode_calls_on_default_large_instances(worlds, world):
    """An instance with the default shapes sized for 160 tokens of top-8 (on GPUs the prefill shape;
    calls given ``tokens_bound`` take the default ``decode_shape``), called with at most 5 tokens,
    every other call bounded: every call exact."""
    for bad in worlds(world).run(job, 8 * world, 8, 256, 160, "random", 4, mode="auto", call_tokens=5,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,limit", dealt([8, 2048], 3, 2))
def test_one_kernel_entries_moves_the_one_kernel_limit(worlds, world, limit):
    """``MoEShape.one_kernel_entries``: at 8, an instance of 40 tokens of top-3 dispatches calls
    given ``tokens_bound=2`` (6 entries) in one kernel and the others in two; at 2048 one of 400
    tokens dispatches every call in one kernel. Every call exact."""
    if worlds(world).backend == "cuda" and limit > 1024:
        pytest.skip("2048 entries in a program's registers: a CPU-world check of the bookkeeping")
    shape = replace(SHAPES["cpu"], one_kernel_entries=limit)
    tokens, most = (40, 2) if limit == 8 else (400, 5)
    for bad in worlds(world).run(job, 4 * world, 3, 24, tokens, "random", 4, capacity=12, shape=shape,
                                 call_tokens=most, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,shared_from", dealt([0, 1 << 20], 3, 2))
def test_routing_copies_sized_by_the_bound(worlds, world, shared_from):
    """``MoEShape.bounded_copies`` on a one-kernel instance of 40 tokens of top-3: calls given
    ``tokens_bound=2`` send copies of 8 entries, the others of 128, alternating on the same copy
    table (one shared copy, or one per program); every call exact and every Lamport buffer at rest
    after them."""
    shape = replace(SHAPES["cpu"], bounded_copies=True, shared_copy_from=shared_from)
    for bad in worlds(world).run(job, 4 * world, 3, 24, 40, "random", 4, shape=shape, call_tokens=2,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,path", dealt(["one-kernel", "routed"], 3, 2))
def test_an_expert_twice_in_a_row(worlds, world, path):
    """Every other token names its first expert again as its last: each entry gets its own slot, in
    ``(token, j)`` order, on the one-kernel and the routed dispatch, capacity drops included, every
    other call bounded; every call exact."""
    shape = None if path == "one-kernel" else replace(SHAPES["cpu"], one_kernel=False, route_above=4)
    for bad in worlds(world).run(job, 4 * world, 3, 24, 40, "repeats", 4, capacity=8, shape=shape, call_tokens=12,
                                 bound_odd=True):
        assert bad == []


def _traced_job(ctx, path: str) -> list[bool]:
    """The same calls on an instance with stage stamps on (``trace_stages``) and on one without:
    the traced builds (other kernels) give the same bits, the stamps' tensors have the stages'
    shapes, and with rows for 3 calls the two calls write rows 0 and 1 of their path's dispatch
    stamps and of the combine's, not row 2 (poisoned before); the routed layout's first item taken
    alone (``routed-single``: no pairs) stamps its start and its slots."""
    from tritoncomm.collectives.moe.combine import COMBINE_STAGES
    from tritoncomm.collectives.moe.onekernel import DISPATCH_STAGES
    from tritoncomm.collectives.moe.route import ROUTED_STAGES

    comm = make_comm(ctx, heap_bytes=64 << 20)
    shape = replace(SHAPES["cpu"], one_kernel=path == "one-kernel", route_above=4,
                    paired_layout=path != "routed-single")
    got, checks = [], []
    for traced in (False, True):
        moe = MoEAllToAll(comm, max_tokens=6, hidden=40, num_experts=4 * ctx.world, top_k=2, shape=shape)
        if traced:
            stamps = moe.trace_stages(calls=3)
            checks.append([tuple(t.shape[2:]) for t in stamps] == [(DISPATCH_STAGES, 2), (COMBINE_STAGES, 2),
                                                                   (ROUTED_STAGES, 2)])
            for t in stamps:
                t.fill_(-1)
        calls = []
        for rep in range(2):
            g = torch.Generator().manual_seed(100 * rep + ctx.rank)
            n = 6 - 2 * rep
            x = torch.randn(n, 40, generator=g).to(torch.bfloat16).to(ctx.device)
            ids = torch.rand(n, 4 * ctx.world, generator=g).topk(2).indices.to(ctx.device)
            w = torch.rand(n, 2, generator=g).to(ctx.device)
            xe, counts, h = moe.dispatch(x, ids, w)
            moe.expert_buffer().copy_(xe)
            calls.append((moe.combine(moe.expert_buffer(), h).clone(), counts.clone()))
        got.append(calls)
        moe.close()
        if traced:  # the routed stages 9-10 need a kept slot, 7-8 an item taken alone (routed-single)
            stages = {"one-kernel": DISPATCH_STAGES, "routed": 7, "routed-single": 9}[path]
            used = [stamps[0 if path == "one-kernel" else 2][:, :, :stages], stamps[1]]
            checks.append([[bool((t[row] != -1).all()) for row in range(3)] for t in used] == [[True, True, False]] * 2)
    comm.close()
    checks += [torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*got, strict=True)]
    return checks


@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("path", ["one-kernel", "routed", "routed-single"])
def test_traced_builds_give_the_same_results(worlds, world, path):
    for checks in worlds(world).run(_traced_job, path):
        assert checks == [True] * 4, checks
