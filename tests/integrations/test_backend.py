"""The ``tritoncomm`` torch.distributed backend: groups built by torch.distributed
(``new_group(backend="tritoncomm")``, ``init_process_group(...)``), served ops against the sum in rank
order (gathered over gloo), delegated ops, functional collectives and ``torch.compile``; on GPUs also
CUDA graphs and NCCL as the inner backend. Every test runs in the CPU world (CPU tensors, interpreted
kernels) and, with ``TRITONCOMM_TEST_BACKEND=cuda``, on GPUs (CUDA tensors)."""

from __future__ import annotations

import os
import queue
import socket
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import tritoncomm
from tritoncomm.launch import end_rank, join_ranks

from ..conftest import BACKEND, SHARED_GPUS
from ..helpers import world_sizes
from .enginetest import gathered, rank_order_sum


class _Count:
    """Counts the calls of a collective (and still makes them)."""

    def __init__(self, collective) -> None:
        self.collective, self.calls = collective, 0
        self.max_bytes = collective.max_bytes

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.collective(*args, **kwargs)

    def fits_rows(self, *args):
        return self.collective.fits_rows(*args)

    def close(self) -> None:
        self.collective.close()


def _group():
    g = dist.new_group(backend="tritoncomm")
    counts = {k: _Count(getattr(g, k)) for k in ("ar", "ag", "rs", "a2a")}
    for k, c in counts.items():
        setattr(g, k, c)
    return g, counts


def _on_device(ctx, t: torch.Tensor) -> torch.Tensor:
    return t.to(ctx.device)


def _all(ctx, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t``, on this rank's device (gathered over gloo)."""
    return [_on_device(ctx, p) for p in gathered(ctx, t.cpu())]


def _served(ctx, dtype):
    g, counts = _group()
    w, r = ctx.world, ctx.rank
    bad = []
    for n in (1, 5, 1000, 4099):
        for rep in range(2):  # repeated calls, fresh data
            x = torch.randn(n * w, generator=torch.Generator().manual_seed(10 * n + rep + 1000 * r)).to(dtype)
            x = _on_device(ctx, x)
            want = rank_order_sum(_all(ctx, x), dtype)
            y = x.clone()
            dist.all_reduce(y, group=g)  # in place
            a = x.clone()
            work = dist.all_reduce(a, group=g, async_op=True)
            work.wait()
            f = fc.wait_tensor(fc.all_reduce(x, "sum", g))
            shard = x[:n].contiguous()
            ag = torch.full((n * w,), float("nan"), dtype=dtype, device=ctx.device)  # poisoned
            dist.all_gather_into_tensor(ag, shard, group=g)
            fag = fc.wait_tensor(fc.all_gather_tensor(shard, 0, g))
            lst = [torch.empty_like(shard) for _ in range(w)]
            dist.all_gather(lst, shard, group=g)
            rs = torch.full((n,), float("nan"), dtype=dtype, device=ctx.device)
            dist.reduce_scatter_tensor(rs, x, group=g)
            frs = fc.wait_tensor(fc.reduce_scatter_tensor(x, "sum", 0, g))
            rsl = torch.empty(n, dtype=dtype, device=ctx.device)
            dist.reduce_scatter(rsl, list(x.chunk(w)), group=g)
            a2a = torch.full((n * w,), float("nan"), dtype=dtype, device=ctx.device)
            dist.all_to_all_single(a2a, x, group=g)  # no splits: equal
            a2e = torch.full((w, n), float("nan"), dtype=dtype, device=ctx.device)
            dist.all_to_all_single(a2e, x.view(w, n), [1] * w, [1] * w, group=g)  # equal splits given
            fa2a = fc.wait_tensor(fc.all_to_all_single(x, None, None, g))
            sync_opts = dist.AllreduceOptions()
            sync_opts.asyncOp = False  # what dist.all_reduce passes without async_op
            b, c = x.clone(), x.clone()
            w1, w2 = g.allreduce([b], sync_opts), g.allreduce([c], sync_opts)
            checks = {"all_reduce": torch.equal(y, want), "async": torch.equal(a, want) and work.is_completed(),
                      "sync work": (w1 is w2 and w2.result()[0] is c and w2.is_completed() and torch.equal(b, want)
                                    and torch.equal(c, want) and work is not w1),
                      "functional all_reduce": torch.equal(f, want),
                      "all_gather": torch.equal(ag, torch.cat(_all(ctx, shard))),
                      "functional all_gather": torch.equal(fag, ag), "list all_gather": torch.equal(torch.cat(lst), ag),
                      "reduce_scatter": torch.equal(rs, want[r * n:(r + 1) * n]),
                      "functional reduce_scatter": torch.equal(frs, rs), "list reduce_scatter": torch.equal(rsl, rs),
                      "all_to_all": torch.equal(a2a, torch.cat([p[r * n:(r + 1) * n] for p in _all(ctx, x)])),
                      "all_to_all, equal splits": torch.equal(a2e.view(-1), a2a),
                      "functional all_to_all": torch.equal(fa2a, a2a)}
            if ctx.device.type == "cuda":  # launched on a side stream, waited for from the current one
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    torch.cuda._sleep(50_000_000)  # tens of ms: without the wait, the check below reads too early
                    s2 = x.clone()
                    work2 = dist.all_reduce(s2, group=g, async_op=True)
                pending = not work2.is_completed()
                work2.wait()
                checks["async, other stream"] = pending and torch.equal(s2, want)
            bad += [(n, k) for k, v in checks.items() if not v]
    calls = {k: c.calls for k, c in counts.items()}
    dist.destroy_process_group(g)
    return bad, calls


@pytest.mark.parametrize("world, dtype", [(2, torch.bfloat16), (2, torch.float16), (2, torch.float32),
                                          (3, torch.bfloat16), (4, torch.float32)])
def test_served_ops_match_gloo(worlds, world, dtype):
    for bad, calls in worlds(world).run(_served, dtype):
        assert bad == []
        ars = 6 if BACKEND == "cuda" else 5  # the GPU adds the side-stream call
        assert calls == {"ar": 4 * 2 * ars, "ag": 4 * 2 * 3, "rs": 4 * 2 * 3, "a2a": 4 * 2 * 3}, calls


def _layouts(ctx):
    """The same calls with another layout on each rank (rank 0 contiguous, rank 1 column-major, the
    others strided), and an all-gather whose input is its output's own shard: every rank serves them (no
    split between kernel and inner backend), with the references' results."""
    g, counts = _group()
    w, r, dev = ctx.world, ctx.rank, ctx.device

    def laid(t: torch.Tensor) -> torch.Tensor:  # t's values in this rank's layout
        if r == 0:
            return t.clone()
        if r == 1 and t.dim() == 2:
            return t.t().contiguous().t()
        return torch.zeros(2 * t.numel(), dtype=t.dtype, device=dev)[::2].view(t.shape).copy_(t) if t.dim() == 1 \
            else torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=dev)[:, ::2].copy_(t)

    base = _on_device(ctx, torch.randn(8, 8 * w, generator=torch.Generator().manual_seed(31 + r)))
    shard = base[:, :8].reshape(-1)
    y = laid(base)
    checks = {"rank 0 alone contiguous": y.is_contiguous() == (r == 0)}
    dist.all_reduce(y, group=g)
    checks["all_reduce"] = torch.equal(y, rank_order_sum(_all(ctx, base), torch.float32))
    want_ag = torch.cat(_all(ctx, shard))
    out = laid(torch.full((w * 64,), float("nan"), device=dev))
    dist.all_gather_into_tensor(out, laid(shard), group=g)
    checks["all_gather"] = torch.equal(out, want_ag)
    inplace = torch.full((w * 64,), float("nan"), device=dev)
    inplace[r * 64:(r + 1) * 64] = shard
    dist.all_gather_into_tensor(inplace, inplace[r * 64:(r + 1) * 64], group=g)  # input: the output's shard
    checks["in-place all_gather"] = torch.equal(inplace, want_ag)
    flat = base.reshape(-1)
    part = laid(torch.full((8 * 8,), float("nan"), device=dev))
    dist.reduce_scatter_tensor(part, laid(flat), group=g)
    checks["reduce_scatter"] = torch.equal(part, rank_order_sum(_all(ctx, flat), torch.float32).view(w, -1)[r])
    checks["served everywhere"] = (counts["ar"].calls, counts["ag"].calls, counts["rs"].calls) == (1, 2, 1)
    dist.destroy_process_group(g)
    return checks


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_layout_never_splits_the_ranks(worlds, world):
    """Serving depends on what every rank shares, never on layout or addresses (the ranks never split)."""
    for checks in worlds(world).run(_layouts):
        assert all(checks.values()), checks


def _skipped_call(ctx):
    """Rank 1 skips one all-reduce of a group whose timeout is 1 s: rank 0's work for that call never
    reports success (``wait`` raises, ``is_success`` False, ``exception`` and the future hold the error),
    and a synchronous call after it raises too. On GPUs ``wait`` does not block the host (as NCCL's
    does not): it raises only once the kernel has ended, so the checks follow ``synchronize``."""
    from datetime import timedelta

    g = dist.new_group(backend="tritoncomm", timeout=timedelta(seconds=1))
    x = torch.ones(64, device=ctx.device)
    seen = {}
    if ctx.rank == 0:
        work = dist.all_reduce(x, group=g, async_op=True)
        if ctx.backend == "cuda":
            seen["success before its end"] = work.is_success()
            work.synchronize()
        try:
            work.wait()
            seen["wait"] = "returned"
        except tritoncomm.CommTimeoutError as e:
            seen["wait"] = f"raised: rank {e.rank} peer {e.peer}"
        seen["is_success"] = work.is_success()
        seen["exception"] = type(work.exception()).__name__
        try:
            work.get_future().wait()
            seen["future"] = "returned"
        except Exception as e:  # the future carries the same error
            seen["future"] = type(e).__name__
        try:
            dist.all_reduce(x.clone(), group=g)
            seen["next"] = "returned"
        except tritoncomm.CommTimeoutError:
            seen["next"] = "raised"
    t0 = time.monotonic()
    dist.destroy_process_group(g)  # a broken group closes within its bound
    seen["closed within"] = time.monotonic() - t0 < 30
    return seen


def test_a_timed_out_call_never_reports_success(worlds):
    seen = worlds(2).run(_skipped_call)[0]
    assert seen["wait"] == "raised: rank 0 peer 1" and seen["is_success"] is False, seen
    assert seen["exception"] == seen["future"] == "CommTimeoutError", seen
    assert seen["next"] == "raised" and seen["closed within"], seen
    assert seen.get("success before its end") in (None, False), seen


def _uneven(ctx, dtype):
    """The list all_gather and reduce_scatter with shards of different rows (rank ``r``: ``r + 1``,
    one rank with none where the world allows), served, against references built from every rank's
    seeded inputs: the gathered rows exactly, the sums in rank order."""
    g, counts = _group()
    w, r = ctx.world, ctx.rank
    rows = [(q + 1) % 4 for q in range(w)]  # world 4: a rank with none
    bad = []
    for rep in range(2):
        mk = [torch.randn(n, 6, generator=torch.Generator().manual_seed(50 * rep + q)).to(dtype)
              for q, n in enumerate(rows)]
        outs = [torch.full((n, 6), float("nan"), dtype=dtype, device=ctx.device) for n in rows]
        dist.all_gather(outs, _on_device(ctx, mk[r]), group=g)
        if not all(torch.equal(o.cpu(), m) for o, m in zip(outs, mk, strict=True)):
            bad.append(("list all_gather", rep))
        parts = [[torch.randn(n, 6, generator=torch.Generator().manual_seed(900 + 50 * rep + 10 * q + s)).to(dtype)
                  for s, n in enumerate(rows)] for q in range(w)]  # rank q's shard for rank s
        out = torch.full((rows[r], 6), float("nan"), dtype=dtype, device=ctx.device)
        dist.reduce_scatter(out, [_on_device(ctx, p) for p in parts[r]], group=g)
        want = torch.stack([parts[q][r].float() for q in range(w)]).sum(0).to(dtype)
        if not torch.equal(out.cpu(), want):
            bad.append(("list reduce_scatter", rep))
    calls = {k: c.calls for k, c in counts.items()}
    dist.destroy_process_group(g)
    return bad, calls


@pytest.mark.parametrize("world", [2, 4])
def test_uneven_list_all_gather_and_reduce_scatter_served(worlds, world):
    for bad, calls in worlds(world).run(_uneven, torch.bfloat16):
        assert bad == [] and calls["ag"] == 2 and calls["rs"] == 2, (bad, calls)


def _delegated(ctx):
    g, counts = _group()
    w, r, dev = ctx.world, ctx.rank, ctx.device
    results = {}
    m = torch.full((3,), float(r), device=dev)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=g)
    results["max"] = m.tolist() == [float(w - 1)] * 3
    i = torch.full((4,), r + 1, dtype=torch.int64, device=dev)
    dist.all_reduce(i, group=g)
    results["int64"] = i.tolist() == [w * (w + 1) // 2] * 4
    big = torch.ones(g.ar.max_bytes // 4 + 1, device=dev)  # past the served size
    dist.all_reduce(big, group=g)
    results["big"] = bool((big == w).all())
    b = torch.full((3,), float(r), device=dev)
    dist.broadcast(b, 0, group=g)
    results["broadcast"] = b.tolist() == [0.0] * 3
    a2a = torch.arange(w + 1, dtype=torch.float32, device=dev) + 10 * r  # uneven: rank 0 gets two rows
    o2a = torch.empty(2 * w if r == 0 else w, device=dev)
    dist.all_to_all_single(o2a, a2a, [2 if r == 0 else 1] * w, [2] + [1] * (w - 1), group=g)
    want = [float(k + 10 * s) for s in range(w) for k in range(2)] if r == 0 else \
        [float(r + 1 + 10 * s) for s in range(w)]
    results["uneven all_to_all"] = o2a.tolist() == want
    red = torch.ones(2, device=dev)
    dist.reduce(red, 0, group=g)
    results["reduce"] = r != 0 or red.tolist() == [float(w)] * 2
    if w >= 2:
        t = torch.full((2,), float(r), device=dev)
        if r == 0:
            dist.send(t + 5, 1, group=g)
        elif r == 1:
            dist.recv(t, 0, group=g)
            results["send/recv"] = t.tolist() == [5.0, 5.0]
    objs = [None] * w
    dist.all_gather_object(objs, {"rank": r}, group=g)
    results["all_gather_object"] = objs == [{"rank": k} for k in range(w)]
    if dev.type == "cuda":  # a CPU tensor on a GPU group: gloo, as with "cpu:gloo,cuda:nccl"
        cpu = torch.full((2,), float(r + 1))
        dist.all_reduce(cpu, group=g)
        results["cpu tensor"] = cpu.tolist() == [float(w * (w + 1) // 2)] * 2
    dist.barrier(group=g)
    # every delegated operation went through the group's Python methods (the GIL released while waiting)
    results["forwarded from Python"] = {"broadcast", "this all_to_all", "reduce", "barrier"} <= g._logged
    results["calls"] = {k: c.calls for k, c in counts.items()}
    dist.destroy_process_group(g)
    return results


#: The largest world every backend's machine has: three ranks in the CPU world, two GPUs.
SMALL_WORLD = 2 if BACKEND == "cuda" else 3


@pytest.mark.nccl
@pytest.mark.parametrize("world", world_sizes(SMALL_WORLD))
def test_delegated_ops_work(worlds, world):
    for res in worlds(world).run(_delegated):
        calls = res.pop("calls")
        assert [k for k, v in res.items() if not v] == []
        assert calls == {"ar": 0, "ag": 0, "rs": 0, "a2a": 0}, calls


def _two_groups_and_compile(ctx):
    g_all, _ = _group()
    sub = dist.new_group([0, 1], backend="tritoncomm")  # collective over every rank, served on 0 and 1
    x = torch.full((64,), float(ctx.rank + 1), device=ctx.device)
    y = x.clone()
    dist.all_reduce(y, group=g_all)
    ok = [torch.equal(y, torch.full_like(x, float(sum(range(1, ctx.world + 1)))))]
    if ctx.rank in (0, 1):
        z = x.clone()
        dist.all_reduce(z, group=sub)
        ok.append(torch.equal(z, torch.full_like(x, 3.0)) and sub.comm is not None)
    with tritoncomm.distributed.graph_capture(g_all):  # outside CUDA-graph capture it only wraps
        c = x.clone()
        dist.all_reduce(c, group=g_all)
    ok.append(torch.equal(c, y))

    def layer(t):
        return fc.all_reduce(torch.relu(t) * 2, "sum", g_all) + 1

    compiled = torch.compile(layer, fullgraph=True)  # the default inductor backend
    for rep in range(2):
        t = torch.randn(96, generator=torch.Generator().manual_seed(rep + 10 * ctx.rank)).to(ctx.device)
        want = rank_order_sum(_all(ctx, torch.relu(t) * 2), torch.float32) + 1
        ok.append(torch.allclose(compiled(t), want, rtol=1e-6, atol=1e-6))
    if ctx.rank in (0, 1):
        dist.destroy_process_group(sub)
    dist.destroy_process_group(g_all)
    return ok


def test_two_groups_and_inductor(worlds):
    for ok in worlds(SMALL_WORLD).run(_two_groups_and_compile):
        assert all(ok), ok


def _graphs(ctx):
    """Served calls captured in one CUDA graph inside ``graph_capture``, replayed with fresh data."""
    g, counts = _group()
    w, r, dev, dt = ctx.world, ctx.rank, ctx.device, torch.bfloat16
    n = 4099
    buf = torch.empty(n * w, dtype=dt, device=dev)  # all-reduced in place
    src = torch.empty(n * w, dtype=dt, device=dev)  # functional all-reduce's input
    ag_out = torch.empty(n * w, dtype=dt, device=dev)
    rs_out = torch.empty(n, dtype=dt, device=dev)

    def body():
        dist.all_reduce(buf, group=g)
        f = fc.wait_tensor(fc.all_reduce(src, "sum", g))
        dist.all_gather_into_tensor(ag_out, src[:n], group=g)
        dist.reduce_scatter_tensor(rs_out, src, group=g)
        return f

    def fill(seed):
        x = torch.randn(n * w, generator=torch.Generator().manual_seed(seed + 100 * r)).to(dt).to(dev)
        buf.copy_(x)
        src.copy_(x)
        return x

    fill(0)
    body()  # eager once: kernels compiled and set up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with tritoncomm.distributed.graph_capture(g), torch.cuda.graph(graph):
        f = body()
    ok = []
    for rep in range(3):  # fresh data each replay
        for t in (buf, ag_out, rs_out, f):
            t.fill_(float("nan"))  # poisoned
        x = fill(rep + 1)
        graph.replay()
        want = rank_order_sum(_all(ctx, x), dt)
        ok.append({"in place": torch.equal(buf, want), "functional": torch.equal(f, want),
                   "all_gather": torch.equal(ag_out, torch.cat([p[:n] for p in _all(ctx, x)])),
                   "reduce_scatter": torch.equal(rs_out, want[r * n:(r + 1) * n])})
    calls = {k: c.calls for k, c in counts.items()}
    del graph
    dist.destroy_process_group(g)
    return ok, calls


@pytest.mark.gpu
def test_cuda_graphs_replay_served_calls(worlds):
    for ok, calls in worlds(2).run(_graphs):
        assert all(all(c.values()) for c in ok), ok
        assert calls == {"ar": 4, "ag": 2, "rs": 2, "a2a": 0}, calls  # eager + capture; replays never call Python


# -- init_process_group in fresh processes ---------------------------------------------------------------------
#: What each world passes to ``init_process_group``.
INIT_BACKEND = "cpu:gloo,cuda:tritoncomm" if BACKEND == "cuda" else "cpu:tritoncomm"


def _init_job(rank: int, world: int, port: int, q) -> None:
    if SHARED_GPUS:
        os.environ["TRITONCOMM_SHARED_GPUS"] = "1"
    if BACKEND == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(INIT_BACKEND, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        pg = dist.group.WORLD
        dev = torch.device("cuda", torch.cuda.current_device()) if BACKEND == "cuda" else torch.device("cpu")
        x = torch.full((8,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(x)
        objs = [None] * world
        dist.all_gather_object(objs, rank)
        q.put((rank, type(pg).__name__, dist.get_backend(), pg.comm is not None, x.tolist(), objs))
    finally:
        end_rank()


def test_init_process_group():
    for _, kind, backend, served, x, objs in _spawn(_init_job, 2):
        assert (kind, backend, served) == ("TritonCommProcessGroup", INIT_BACKEND, True)
        assert x == [3.0] * 8 and objs == [0, 1]


# -- model code nobody here wrote: transformers' own tensor parallelism ---------------------------------------
def _hf_job(rank: int, world: int, port: int, backend: str, path: str, static: bool, q) -> None:
    gpu = rank % max(1, torch.cuda.device_count()) if BACKEND == "cuda" else 0
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(gpu), WORLD_SIZE=str(world))  # transformers: cuda:LOCAL_RANK
    if SHARED_GPUS:
        os.environ["TRITONCOMM_SHARED_GPUS"] = "1"
    if BACKEND == "cuda":
        torch.cuda.set_device(gpu)
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        from transformers import AutoModelForCausalLM, DistributedConfig, LlamaConfig, LlamaForCausalLM

        if rank == 0 and not os.path.exists(os.path.join(path, "config.json")):
            cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              num_hidden_layers=2, vocab_size=128, max_position_embeddings=64)
            torch.manual_seed(0)  # random weights, no download
            LlamaForCausalLM(cfg).save_pretrained(path)
        dist.barrier(group=dist.new_group(backend="gloo"))  # on the CPU: NCCL refuses ranks that share a GPU
        pg = dist.group.WORLD
        counts = {}
        if isinstance(pg, tritoncomm.distributed.TritonCommProcessGroup):
            counts = {k: _Count(getattr(pg, k)) for k in ("ar", "ag", "rs")}
            for k, c in counts.items():
                setattr(pg, k, c)
        model = AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_plan="auto", tp_size=world), dtype=torch.float32)
        sharded = type(model.model.layers[0].mlp.down_proj.weight).__name__
        prompt = torch.tensor([[1, 5, 9, 13]], device=model.device)
        # static: transformers compiles the decode step (inductor, mode "reduce-overhead": CUDA graph trees)
        kw = {"cache_implementation": "static"} if static else {}
        tokens = model.generate(prompt, max_new_tokens=16, do_sample=False, **kw)
        from torch._dynamo.utils import counters

        compiled = counters["stats"]["unique_graphs"]
        q.put((rank, tokens.tolist(), sharded, {k: c.calls for k, c in counts.items()}, compiled))
    except Exception:
        import traceback

        q.put((rank, traceback.format_exc(), None, None, None))
    finally:
        end_rank()


def _spawn(target, world: int, *args, baseline: bool = False) -> list:
    """Run ``target`` in ``world`` spawned ranks and return their results. A rank that reports and then
    does not exit fails the test, except in a ``baseline`` run (another backend than ours), where it
    is reported as a warning: NCCL's ranks can stall at exit after transformers' static cache
    (``docs/backend.md``)."""
    import sys

    import torch.multiprocessing as mp

    if BACKEND == "cuda" and torch.cuda.device_count() < world and not SHARED_GPUS:
        pytest.skip(f"needs {world} GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    saved = os.environ.get("TRITON_INTERPRET"), list(sys.path)
    if BACKEND != "cuda":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        procs = [ctx.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        if saved[0] is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved[0]
        sys.path[:] = saved[1]
    results, deadline = [], time.monotonic() + 600
    while len(results) < world:  # a rank that dies without reporting fails the test at once
        try:
            results.append(q.get(timeout=2))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                pytest.fail(f"ranks {dead} exited with codes {[procs[r].exitcode for r in dead]}" if dead
                            else "no result within 600 s")
    stalled = join_ranks(procs)
    message = f"ranks reported, then did not exit cleanly (exit codes {stalled}; stacks on stderr)"
    if baseline and stalled:
        warnings.warn(f"baseline run: {message}", stacklevel=2)
    else:
        assert not stalled, message
    return sorted(results)


@pytest.mark.parametrize("static", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["eager", "static"])
def test_transformers_tp_plan_same_tokens(tmp_path, static):
    """A Llama-architecture model from a config (random weights), sharded by transformers' own
    ``tp_plan="auto"`` at TP2, greedy generation with the tritoncomm backend and with gloo (CPU world)
    or NCCL (GPUs): the same tokens on every rank and with both backends. ``static``: transformers'
    static cache, which compiles the decode step into CUDA graphs (the backend's calls are captured
    in them). On ranks that share a GPU only the tritoncomm run happens (NCCL refuses them): its
    ranks must agree."""
    import sys

    from .engines import fetch

    # transformers and accelerate are among the engines' dependencies in the CPU world; GPU images have them
    paths = fetch() if BACKEND != "cuda" else []
    base = "cpu:gloo,cuda:nccl" if BACKEND == "cuda" else "cpu:gloo"
    runs = {}
    for backend in ((INIT_BACKEND,) if SHARED_GPUS else (base, INIT_BACKEND)):
        sys.path[:0] = paths  # the spawned ranks' path; _spawn restores ours
        runs[backend] = _spawn(_hf_job, 2, backend, str(tmp_path / "tiny-llama"), static,
                               baseline=backend != INIT_BACKEND)
    want = runs[INIT_BACKEND if SHARED_GPUS else base][0][1]
    for backend, results in runs.items():
        for rank, tokens, sharded, _, compiled in results:
            assert sharded == "DTensor", (backend, rank, tokens)
            assert tokens == want, (backend, rank)
            assert (compiled > 0) == static, (backend, rank, compiled)  # static generation compiled, eager did not
    for _, _, _, calls, _ in runs[INIT_BACKEND]:
        assert calls["ar"] > 0 and calls["ag"] > 0, calls  # transformers' all-reduces and gathers were ours
