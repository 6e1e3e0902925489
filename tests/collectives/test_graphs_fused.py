"""GPU only: the fused ops, the TP decoder and the engine adapters captured in CUDA graphs and
replayed with fresh data in the same buffers."""

from __future__ import annotations

import pytest
import torch

from tritoncomm.collectives import FUSED_ALGOS, FusedAllReduceAddRMSNorm, GemmAllReduce
from tritoncomm.integrations import TritonCommCustomAllreduce
from tritoncomm.integrations.tp import LlamaDecoderLayer, TritonCommReducer

from ..helpers import make_comm, reference_sum, same_on_all_ranks, warm_up_for_capture, world_sizes
from ..integrations.tpmodel import HEADS, KV, LAYERS, H, tp_weights

pytestmark = pytest.mark.gpu


def _capture(fn):
    warm_up_for_capture(fn)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _job_fused_graph(ctx, t, h):
    comm = make_comm(ctx)
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=t, max_hidden=h, algos=FUSED_ALGOS)
    dev = ctx.device
    x = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    res = torch.empty_like(x)
    w = (torch.rand(h, generator=torch.Generator().manual_seed(h)) + 0.5).to(torch.bfloat16).to(dev)
    outs = {a: torch.empty_like(x) for a in FUSED_ALGOS}
    bad = []
    for algo in FUSED_ALGOS:
        graph = _capture(lambda algo=algo: fused(x, res, w, out=outs[algo], algo=algo))
        for it in range(5):
            g = torch.Generator().manual_seed(100 * it + ctx.rank)
            x.copy_(torch.randn(t, h, generator=g).to(torch.bfloat16))
            r0 = torch.randn(t, h, generator=torch.Generator().manual_seed(it)).to(torch.bfloat16)
            res.copy_(r0)
            outs[algo].fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            new_res = (reference_sum(ctx, x) + r0.float()).to(torch.bfloat16).float()
            want = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float().cpu()
            checks = {"residual": torch.allclose(res.float().cpu(), new_res, rtol=1e-2, atol=1e-2),
                      "out": torch.allclose(outs[algo].float().cpu(), want, rtol=2e-2, atol=2e-2),
                      "ranks": same_on_all_ranks(ctx, outs[algo])}
            if not all(checks.values()):
                err = (outs[algo].float().cpu() - want).abs().max().item()
                bad.append((algo, it, [k for k, v in checks.items() if not v], err))
        del graph
    fused.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_fused_norm_graph_replay_fresh_data(worlds, world):
    for bad in worlds(world).run(_job_fused_graph, 37, 8192):
        assert bad == []


def _job_gemm_graph(ctx, m, k, n):
    comm = make_comm(ctx)
    op = GemmAllReduce(comm, max_tokens=m, n=n)
    dev = ctx.device
    x = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
    w = (torch.randn(n, k, device=dev) / k ** 0.5).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    bad = []
    for path in ("overlap", "chunked", "plain"):
        graph = _capture(lambda path=path: op(x, w, out=out, path=path))
        for it in range(4):
            x.copy_(torch.randn(m, k, generator=torch.Generator().manual_seed(it * 10 + ctx.rank)).to(torch.bfloat16))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = reference_sum(ctx, x.float().cpu() @ w.float().cpu().t())
            err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
            if not (err < 2e-2 and same_on_all_ranks(ctx, out)):
                bad.append((path, it, err))
        del graph
    op.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_gemm_allreduce_graph_replay_fresh_data(worlds, world):
    for bad in worlds(world).run(_job_gemm_graph, 300, 1000, 1536):
        assert bad == []


def _job_adapter_graph(ctx):
    ca = TritonCommCustomAllreduce(ctx.cpu_group, ctx.device, max_size=4 << 20)
    assert not ca.disabled
    x = torch.empty(300_001, dtype=torch.bfloat16, device=ctx.device)
    holder = {}

    def call():
        holder["y"] = ca.custom_all_reduce(x)

    with ca.capture():
        graph = _capture(call)
    bad = []
    for it in range(5):
        x.copy_(torch.randn(x.numel(), generator=torch.Generator().manual_seed(it + 7 * ctx.rank)).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_sum(ctx, x)
        err = ((holder["y"].float().cpu() - ref).abs().max() / ref.abs().max()).item()
        if not (err < 2e-2 and same_on_all_ranks(ctx, holder["y"])):
            bad.append((it, err))
    del graph
    ca.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_vllm_adapter_graph_replay_fresh_data(worlds, world):
    for bad in worlds(world).run(_job_adapter_graph):
        assert bad == []


def _job_decoder_graph(ctx, decode):
    comm = make_comm(ctx)
    red = TritonCommReducer(comm, max_tokens=64, hidden=H)
    layers = [LlamaDecoderLayer({k: v.to(ctx.device) for k, v in tp_weights(i).items()}, HEADS, KV, red).to(ctx.device)
              for i in range(LAYERS)]
    x = torch.empty(2, 1 if decode else 5, H, dtype=torch.bfloat16, device=ctx.device)
    residual = torch.empty_like(x)
    g = torch.Generator().manual_seed(5 + ctx.rank)
    # decode: each layer's cache (2 sequences, local KV heads, 6 past tokens + the step's slot)
    caches = [tuple(torch.randn(2, KV // ctx.world, 7, H // HEADS, generator=g).to(torch.bfloat16).to(ctx.device)
                    for _ in range(2)) if decode else None for _ in range(LAYERS)]

    def step():
        residual.zero_()
        p = x
        for layer, cache in zip(layers, caches, strict=True):
            p = layer(p, residual, cache)
        return p

    bad = []
    with torch.no_grad():
        graph = _capture(step)
        for it in range(3):
            x.copy_(torch.randn(*x.shape, generator=torch.Generator().manual_seed(it)).to(torch.bfloat16))
            graph.replay()
            torch.cuda.synchronize()
            replayed = residual.clone()
            step()
            torch.cuda.synchronize()
            if not (torch.equal(replayed, residual) and same_on_all_ranks(ctx, replayed)):
                bad.append(it)
    del graph
    red.close()
    comm.close()
    return bad


@pytest.mark.parametrize("decode", [False, True])
def test_tp_decoder_graph_replay_equals_eager(worlds, decode):
    """Prefill, and a decode step over a KV cache (written in place), replay with fresh inputs."""
    for bad in worlds(2).run(_job_decoder_graph, decode):
        assert bad == []


def _job_ops_and_communicator_graph(ctx):
    """The custom ops (every collective and fused op) and the engines' custom all-reduce slot (inside
    its ``capture``, which registers the captured outputs), in one CUDA graph replayed with fresh inputs."""
    import tritoncomm.integrations as ti
    from tritoncomm.integrations.vllm import TritonCommCustomAllreduce

    w = ctx.world
    gc = ti.default_registry.setup(ctx.group, cpu_group=ctx.cpu_group, device=ctx.device, max_bytes=1 << 22)
    gc.setup_fused_norm(max_tokens=16, hidden=1024)
    gc.setup_gemm(max_tokens=64, n=512)
    name = ti.default_registry.name_of(ctx.group)
    ca = TritonCommCustomAllreduce(ctx.cpu_group, ctx.device, max_size=1 << 22)
    dev, bf = ctx.device, torch.bfloat16
    x = torch.empty(4096, dtype=bf, device=dev)
    part = torch.empty(16, 1024, dtype=bf, device=dev)
    res = torch.empty(16, 1024, dtype=bf, device=dev)
    nw = (torch.rand(1024, generator=torch.Generator().manual_seed(1)) + 0.5).to(bf).to(dev)
    a = torch.empty(64, 256, dtype=bf, device=dev)
    wl = (torch.randn(512, 256, generator=torch.Generator().manual_seed(2 + ctx.rank)) / 16).to(bf).to(dev)
    outs = {}

    def body():
        outs["ar"] = torch.ops.tritoncomm.all_reduce(x, name)
        outs["ag"] = torch.ops.tritoncomm.all_gather(x[:64], name, w)
        outs["rs"] = torch.ops.tritoncomm.reduce_scatter(x[: 64 * w], name, w)
        outs["norm"] = torch.ops.tritoncomm.fused_add_rms_norm(part, res, nw, 1e-6, name)
        outs["lin"] = torch.ops.tritoncomm.linear_all_reduce(a, wl, name)
        outs["vllm"] = ca.custom_all_reduce(x)

    with ca.capture():
        graph = _capture(body)
    bad = []
    for it in range(3):
        g = torch.Generator().manual_seed(50 * it + ctx.rank)
        x.copy_(torch.randn(4096, generator=g).to(bf))
        part.copy_(torch.randn(16, 1024, generator=g).to(bf))
        r0 = torch.randn(16, 1024, generator=torch.Generator().manual_seed(it)).to(bf)
        res.copy_(r0)
        a.copy_(torch.randn(64, 256, generator=g).to(bf))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_sum(ctx, x)
        new_res = (reference_sum(ctx, part) + r0.float()).to(bf).float()
        normed = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.float().cpu()
        lin = reference_sum(ctx, a.float().cpu() @ wl.float().cpu().t())
        gathered = [torch.empty(64, dtype=bf) for _ in range(w)]
        torch.distributed.all_gather(gathered, x[:64].cpu(), group=ctx.cpu_group)

        def close(t, r, tol=2e-2):
            return bool(((t.float().cpu() - r).abs().max() / r.abs().max()) < tol)

        checks = {"ar": close(outs["ar"], ref), "vllm": close(outs["vllm"], ref),
                  "ag": torch.equal(outs["ag"].cpu(), torch.cat(gathered)),
                  "rs": close(outs["rs"], ref[: 64 * w][ctx.rank * 64:(ctx.rank + 1) * 64]),
                  "residual": close(res, new_res), "norm": close(outs["norm"], normed), "lin": close(outs["lin"], lin),
                  "ranks": same_on_all_ranks(ctx, outs["ar"]) and same_on_all_ranks(ctx, outs["norm"])}
        if not all(checks.values()):
            bad.append((it, [k for k, v in checks.items() if not v]))
    del graph
    ca.close()
    ti.default_registry.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_custom_ops_and_vllm_communicator_graph_replay(worlds, world):
    for bad in worlds(world).run(_job_ops_and_communicator_graph):
        assert bad == []
