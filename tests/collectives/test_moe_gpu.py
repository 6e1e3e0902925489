"""MoE dispatch and combine on GPUs only: CUDA-graph replays with new routing, and stragglers with no
host synchronisation, on every dispatch path."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tritoncomm.collectives.moe import NEVER, MoEAllToAll, MoEShape

from ..helpers import make_comm, warm_up_for_capture, world_sizes


def _gpu_shape(ctx, max_tokens: int, path: str) -> MoEShape:
    """The default launch shape (``one-kernel`` at these sizes), or the send and gather kernels with
    the route kernel before the send (instances of more than 8 entries) (``routed``; ``routed-direct``:
    every call's rows sent into their first kept slot on each peer; ``routed-chunked``: routed, the
    throughput combine in 4 chunks without its barrier)."""
    from tritoncomm.collectives.moe import default_shape

    shape = default_shape("cuda", max_tokens, torch.cuda.get_device_properties(ctx.device).multi_processor_count)
    if path == "barrier":
        return replace(shape, packets=False)
    if path == "one-kernel":
        return shape
    return replace(shape, one_kernel=False, route_above=8, direct_from_bytes=0 if path == "routed-direct" else NEVER,
                   combine_chunks=4 if path == "routed-chunked" else 0)


def _graph_job(ctx, mode: str, path: str):
    """Dispatch, experts and combine captured once in a CUDA graph, replayed with fresh tokens and
    routing copied into its inputs: every replay equals an eager run of the same inputs."""
    comm = make_comm(ctx, heap_bytes=64 << 20)
    experts, k, hidden, t = max(4, 2 * ctx.world), 2, 256, 8
    local = experts // ctx.world
    shape = _gpu_shape(ctx, t, path)
    eager = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k, mode=mode, name="moe.eager",
                        shape=shape)
    cap = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k, mode=mode, name="moe.graph",
                      shape=shape)
    dev = ctx.device
    x, ids, wts = (torch.empty(t, hidden, dtype=torch.bfloat16, device=dev),
                   torch.empty(t, k, dtype=torch.int64, device=dev), torch.empty(t, k, device=dev))
    scale = (torch.arange(local, device=dev) + ctx.rank * local + 1).float()[:, None, None]

    def step(moe):
        out, _, h = moe.dispatch(x, ids, wts)
        moe.expert_buffer().copy_((out.float() * scale).to(torch.bfloat16))
        return moe.combine(moe.expert_buffer(), h)

    def fill(seed):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(t, hidden, generator=g).to(torch.bfloat16))
        ids.copy_(torch.rand(t, experts, generator=g).topk(k).indices)
        wts.copy_(torch.rand(t, k, generator=g))

    fill(ctx.rank)
    warm_up_for_capture(lambda: step(cap))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step(cap)
    ok = []
    for rep in range(4):
        fill(100 * rep + ctx.rank)
        got.fill_(float("nan"))
        graph.replay()
        want = step(eager)
        ok.append(torch.equal(got, want))
    del graph
    eager.close()
    cap.close()
    comm.close()
    return ok


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("mode", ["latency", "throughput"])
@pytest.mark.parametrize("path", ["one-kernel", "barrier", "routed", "routed-direct", "routed-chunked"])
def test_cuda_graph_replays_with_new_routing(worlds, world, mode, path):
    for ok in worlds(world).run(_graph_job, mode, path):
        assert ok == [True] * 4, ok


def _straggler_job(ctx, calls: int, seed: int, path: str) -> list:
    """``calls`` dispatch + combine calls queued back to back with no host synchronisation, token counts
    and routing new every call (zero tokens included, unrouted entries, both combine modes), one rank's
    stream delayed before 20% of them; then the same calls again, one at a time with a host barrier
    between them. The bits must agree (they depend only on the inputs)."""
    import random

    comm = make_comm(ctx, timeout_s=60)
    experts, k, hidden, t_max = 4 * ctx.world, 3, 512, 64
    local, dev = experts // ctx.world, ctx.device
    moe = MoEAllToAll(comm, max_tokens=t_max, hidden=hidden, num_experts=experts, top_k=k, throughput_from=48,
                      shape=_gpu_shape(ctx, t_max, path))
    scale = (torch.arange(local, device=dev) + ctx.rank * local + 1).float()[:, None, None]
    schedule = random.Random(seed)  # the same on every rank
    late = [(schedule.randrange(ctx.world) if schedule.random() < 0.2 else -1, schedule.randrange(1, 2_000_000))
            for _ in range(calls)]
    inputs = []
    for i in range(calls):  # on the device before the first call: no copy from the host in between
        g = torch.Generator().manual_seed(seed * 1_000_003 + i * 16 + ctx.rank)
        n = int(torch.randint(0, t_max + 1, (1,), generator=g))
        ids = torch.rand(n, experts, generator=g).topk(k).indices
        ids[torch.rand(n, k, generator=g) < 0.1] = -1
        inputs.append((torch.randn(n, hidden, generator=g).to(torch.bfloat16).to(dev), ids.to(dev),
                       torch.rand(n, k, generator=g).to(dev)))
    torch.cuda.synchronize()

    def step(x, ids, w):
        out, counts, h = moe.dispatch(x, ids, w)
        moe.expert_buffer().copy_((out.float() * scale).to(torch.bfloat16))
        return moe.combine(moe.expert_buffer(), h).clone(), counts.clone()

    got = []
    for (x, ids, w), (who, cycles) in zip(inputs, late, strict=True):
        if who == ctx.rank:
            torch.cuda._sleep(cycles)  # this rank's stream falls behind; nobody waits on the host
        got.append(step(x, ids, w))
    torch.cuda.synchronize()
    bad = []
    for i, (x, ids, w) in enumerate(inputs):
        ctx.barrier()
        comb, counts = step(x, ids, w)
        torch.cuda.synchronize()
        if not (torch.equal(got[i][0], comb) and torch.equal(got[i][1], counts)):
            bad.append(i)
    moe.close()
    comm.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("path", ["one-kernel", "barrier", "routed", "routed-direct", "routed-chunked"])
def test_stragglers_with_no_host_sync(worlds, world, path):
    for bad in worlds(world).run(_straggler_job, 200, 11, path, timeout=600):
        assert bad == []
