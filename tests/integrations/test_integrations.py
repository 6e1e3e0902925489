"""Integrations: probe and fallback, the engines' custom all-reduce slot on its own (the engines'
own code drives it in test_vllm.py and test_sglang.py), functional API, custom ops under
torch.compile, hierarchical all-reduce at 2 x 2."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import tritoncomm as tc
import tritoncomm.integrations as ti
from tritoncomm.integrations import TritonCommCustomAllreduce

from ..helpers import check_close, reference_sum, same_on_all_ranks

# ---------------------------------------------------------------------------- rank jobs

def _job_engine(ctx, deny_rank):
    import tritoncomm.integrations.capability as probe_mod

    real = probe_mod.local_peer_access
    if deny_rank is not None and ctx.rank == deny_rank:
        probe_mod.local_peer_access = lambda *a, **kw: [r if i != 0 else "no peer access (simulated)"
                                                        for i, r in enumerate(real(*a, **kw))]
    try:
        ca = TritonCommCustomAllreduce(ctx.cpu_group, ctx.device, max_size=1 << 20)
    finally:
        probe_mod.local_peer_access = real
    x = torch.randn(4096, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    res = {"disabled": ca.disabled, "should": ca.should_custom_ar(x),
           "int_none": ca.custom_all_reduce(torch.ones(16, dtype=torch.int32, device=ctx.device)) is None}
    y = ca.custom_all_reduce(x)
    res["none"] = y is None
    if y is not None:
        check_close(y, reference_sum(ctx, x), torch.float32)
        if ctx.backend == "cuda":  # capture() outside a graph is the engines' warm-up: empty outputs
            graph = torch.cuda.CUDAGraph()
            with ca.capture():
                with torch.cuda.graph(graph):
                    z = ca.custom_all_reduce(x)
            graph.replay()
            torch.cuda.synchronize()
        else:
            with ca.capture():
                z = ca.custom_all_reduce(x)
        res["same"] = same_on_all_ranks(ctx, z) and torch.equal(y, z)
        w, bf = ctx.world, torch.bfloat16
        g = torch.Generator().manual_seed(70 + ctx.rank)
        shard = torch.randn(3, 5, generator=g).to(bf).to(ctx.device)
        parts = [torch.empty_like(shard, device="cpu") for _ in range(w)]
        dist.all_gather(parts, shard.cpu(), group=ctx.cpu_group)
        res["ag"] = torch.equal(ca.custom_all_gather(shard).cpu(), torch.cat(parts))
        full = torch.randn(2 * w, 7, generator=g).to(ctx.device)
        res["rs"] = bool(torch.allclose(ca.custom_reduce_scatter(full).cpu(),
                                        reference_sum(ctx, full).chunk(w)[ctx.rank], rtol=1e-5, atol=1e-5))
        res["odd_rs_none"] = ca.custom_reduce_scatter(torch.ones(2 * w + 1, device=ctx.device)) is None
        xn = torch.randn(5, 40, generator=g).to(bf).to(ctx.device)
        rn = torch.randn(5, 40, generator=torch.Generator().manual_seed(71)).to(bf).to(ctx.device)
        wn = torch.randn(40, generator=torch.Generator().manual_seed(72)).to(bf).to(ctx.device)
        res["fused_unset"] = ca.should_fused_norm(xn, rn, wn)
        ca.setup_fused_norm(8, 40)
        nine = torch.ones(9, 40, dtype=bf, device=ctx.device)
        res["fused_too_many"] = ca.should_fused_norm(nine, nine.clone(), wn)
        norm, new_res = ca.fused_add_rms_norm(xn, rn, wn, 1e-5)
        want_res = (reference_sum(ctx, xn).to(bf).float() + rn.float().cpu()).to(bf)  # the sum rounded, then the add
        v = want_res.float()
        want = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5) * wn.float().cpu()).to(bf)
        res["fused"] = (torch.equal(new_res.cpu(), want_res) and bool((norm.float().cpu() - want.float()).abs().max()
                        <= 2 ** -6 * want.float().abs().max()) and same_on_all_ranks(ctx, norm))
    ca.close()
    return res


@pytest.mark.parametrize("world", [2, 3])
def test_engine_slot_serves_and_matches(worlds, world):
    for r in worlds(world).run(_job_engine, None):
        assert r == {"disabled": False, "should": True, "int_none": True, "none": False, "same": True, "ag": True,
                     "rs": True, "odd_rs_none": True, "fused_unset": False, "fused_too_many": False, "fused": True}


def test_probe_vote_disables_everywhere_and_falls_back(worlds, caplog):
    for r in worlds(3).run(_job_engine, 1):
        assert r["disabled"] and r["none"] and not r["should"]


def _job_probe_reason(ctx):
    import tritoncomm.integrations.capability as probe_mod

    real = probe_mod.local_peer_access
    if ctx.rank == 2:
        probe_mod.local_peer_access = lambda *a, **kw: [r if i != 1 else "no peer access (simulated)"
                                                        for i, r in enumerate(real(*a, **kw))]
    try:
        v = ti.probe(ctx.cpu_group, ctx.device)
    finally:
        probe_mod.local_peer_access = real
    return v.ok, v.reason


def test_probe_gives_every_rank_the_same_reason(worlds):
    results = worlds(3).run(_job_probe_reason)
    assert all(r == results[0] for r in results)
    assert results[0][0] is False and "rank 2 -> rank 1" in results[0][1]


def _job_functional_and_ops(ctx, compile_backend):
    reg = ti.default_registry
    gc = reg.setup(ctx.cpu_group, device=ctx.device, max_bytes=1 << 20)
    name = reg.name_of(ctx.cpu_group)
    w = ctx.world
    x = torch.randn(3000, generator=torch.Generator().manual_seed(5 + ctx.rank)).to(ctx.device)
    ref = reference_sum(ctx, x)
    y = x.clone()
    ti.all_reduce(y, ctx.cpu_group)
    check_close(y, ref, torch.float32)
    check_close(torch.ops.tritoncomm.all_reduce(x, name), ref, torch.float32)
    z = x.clone()
    torch.ops.tritoncomm.all_reduce_(z, name)
    check_close(z, ref, torch.float32)
    g = torch.ops.tritoncomm.all_gather(x[:10].contiguous(), name, w)
    assert g.shape == (10 * w,) and torch.equal(g[ctx.rank * 10:(ctx.rank + 1) * 10], x[:10])
    s = torch.ops.tritoncomm.reduce_scatter(x[: 8 * w].contiguous(), name, w)
    check_close(s, ref[: 8 * w][ctx.rank * 8:(ctx.rank + 1) * 8], torch.float32)
    swap = torch.empty(8 * w)
    dist.all_to_all_single(swap, x[: 8 * w].cpu(), group=ctx.cpu_group)
    before = torch.ops.tritoncomm.all_to_all(x[: 8 * w], name)  # not set up: torch.distributed's
    gc.setup_all_to_all(1 << 16)
    served = torch.ops.tritoncomm.all_to_all(x[: 8 * w], name)
    compiled_a2a = torch.compile(lambda a: torch.ops.tritoncomm.all_to_all(a * 1.0, name), fullgraph=True,
                                 backend=compile_backend)
    assert gc.a2a is not None and all(torch.equal(t.cpu(), swap) for t in (before, served,
                                                                             compiled_a2a(x[: 8 * w])))

    def layer(a: torch.Tensor) -> torch.Tensor:
        h = torch.relu(a) * 2.0
        h = torch.ops.tritoncomm.all_reduce(h, name)
        torch.ops.tritoncomm.all_reduce_(h, name)
        return h + 1.0

    compiled = torch.compile(layer, fullgraph=True, backend=compile_backend)
    expect = reference_sum(ctx, torch.relu(x) * 2.0) * w + 1.0
    check_close(compiled(x), expect, torch.float32)
    check_close(compiled(x), expect, torch.float32)  # cached graph, second call

    # the fused ops: add + RMSNorm after the reduction, and the row-parallel linear
    gc.setup_fused_norm(max_tokens=8, hidden=64)
    gc.setup_gemm(max_tokens=16, n=32, overlap_min_tokens=4)
    gen = torch.Generator().manual_seed(9 + ctx.rank)
    a = torch.randn(6, 48, generator=gen).to(torch.bfloat16).to(ctx.device)
    wl = torch.randn(32, 48, generator=gen).to(torch.bfloat16).to(ctx.device)
    wn = torch.rand(32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(ctx.device)
    res0 = torch.randn(6, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(ctx.device)

    def block(a: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        p = torch.ops.tritoncomm.linear_all_reduce(a, wl, name) * 0.5
        return torch.ops.tritoncomm.fused_add_rms_norm(p, res, wn, 1e-6, name)

    lin = reference_sum(ctx, a.float() @ wl.float().t())
    part = (lin.to(torch.bfloat16).float() * 0.5).to(torch.bfloat16).float()  # already reduced: equal everywhere
    new_res = (w * part + res0.float().cpu()).to(torch.bfloat16).float()  # the fused op sums it over ranks again
    want = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * wn.float().cpu()
    cblock = torch.compile(block, fullgraph=True, backend=compile_backend)
    for fn in (block, cblock):
        res = res0.clone()
        got = fn(a, res)
        assert torch.allclose(res.float().cpu(), new_res, rtol=3e-2, atol=3e-2), "residual"
        assert torch.allclose(got.float().cpu(), want, rtol=3e-2, atol=3e-2), "normed"
        assert same_on_all_ranks(ctx, got)

    # the FP8 and Gemma options of the fused op, eager and compiled
    scale = torch.tensor([0.02], device=ctx.device)

    def fp8_block(p: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        return torch.ops.tritoncomm.fused_add_rms_norm(p, res, wn, 1e-6, name, True, scale)

    pin = torch.randn(6, 32, generator=torch.Generator().manual_seed(3 + ctx.rank)).to(torch.bfloat16).to(ctx.device)
    nr = (reference_sum(ctx, pin) + res0.float().cpu()).to(torch.bfloat16).float()
    y = nr * torch.rsqrt(nr.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + wn.float().cpu())
    want8 = (y / 0.02).clamp(-448, 448)
    for fn in (fp8_block, torch.compile(fp8_block, fullgraph=True, backend=compile_backend)):
        res = res0.clone()
        got = fn(pin, res)
        assert got.dtype == torch.float8_e4m3fn
        assert torch.allclose(got.float().cpu(), want8, rtol=0.13, atol=0.05), "fp8"
    enabled = gc.enabled
    return enabled


@pytest.mark.parametrize("compile_backend", ["aot_eager"])
def test_functional_api_and_custom_ops_under_compile(worlds, compile_backend):
    assert all(worlds(2).run(_job_functional_and_ops, compile_backend, timeout=900))


def _job_hierarchical(ctx):
    groups = ti.node_groups(local_world=2)
    har = ti.HierarchicalAllReduce(groups, max_bytes=1 << 20, device=ctx.device)
    bad = []
    # 300000 float32 = 1.2 MB: past max_bytes, one NCCL/gloo all-reduce over every rank
    for n, dtype, form in ((1, torch.float32, "new"), (7, torch.float32, "out"), (1000, torch.float32, "inplace"),
                           (4099, torch.bfloat16, "new"), (4096, torch.bfloat16, "out"),
                           (300000, torch.float32, "out")):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n + ctx.rank)).to(dtype).to(ctx.device)
        ref = x.float().clone()  # float() of a float32 tensor is the tensor itself
        dist.all_reduce(ref)
        ref = ref.cpu()
        if form == "new":
            out = har(x)
        elif form == "out":
            given = torch.full_like(x, float("nan"))
            out = har(x, given)
            if out is not given:
                bad.append((n, "out= not used"))
        else:
            out = har(x, x)
            if out is not x:
                bad.append((n, "not in place"))
        try:
            check_close(out, ref, dtype)
        except AssertionError as e:
            bad.append((n, str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append((n, "ranks differ"))
    try:
        har(torch.zeros(8, device=ctx.device), torch.zeros(9, device=ctx.device))
        bad.append("a wrong-sized out was accepted")
    except tc.InvalidInputError:
        pass
    har.close()
    return (groups.node, groups.local_rank), bad


def test_hierarchical_allreduce_2x2(worlds):
    results = worlds(4).run(_job_hierarchical)
    assert [r[0] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r[1] == [] for r in results), results


class _OneOfTwo:
    """A bootstrap of two ranks whose peer found what this rank found."""

    world, rank = 2, 0

    def all_gather(self, obj):
        return [obj, obj]


def test_probe_without_cuda_python_refuses_in_one_line(monkeypatch):
    """A GPU but no ``cuda.bindings``: the probe says so (no ModuleNotFoundError), and callers log
    "tritoncomm disabled because ..." and stay on NCCL."""
    from tritoncomm.integrations import capability

    monkeypatch.setattr(capability, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capability, "has_cuda_bindings", lambda: False)
    verdict = capability.probe(None, torch.device("cuda", 0), bootstrap=_OneOfTwo())
    assert not verdict.ok and "cuda-python is not installed" in verdict.reason, verdict


def test_sglang_plugin_without_sglang_logs_and_returns():
    """With TRITONCOMM_ENABLE=1 and no SGLang, SGLang's plugin entry logs one line instead of raising."""
    import os
    import subprocess
    import sys

    code = ("import sys, logging; sys.modules['sglang'] = None; logging.basicConfig(level=logging.INFO)\n"
            "from tritoncomm.integrations.sglang import plugin\nplugin()\nprint('returned')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TRITONCOMM_ENABLE="1"))
    assert proc.returncode == 0 and "returned" in proc.stdout, proc.stderr[-2000:]
    assert "not serving SGLang: its plugin hooks cannot be imported" in proc.stderr, proc.stderr[-2000:]
