"""Integrations: probe and fallback, engine adapter contracts, functional API, custom ops under
torch.compile, hierarchical all-reduce at 2 x 2."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

import tritoncomm.integrations as ti
from tritoncomm.integrations import SGLangCustomAllreduce, TritonCommCustomAllreduce

from .helpers import check_close, reference_sum, same_on_all_ranks

# ---------------------------------------------------------------------------- contracts (pinned)

def test_vllm_custom_allreduce_contract_is_pinned():
    # from vllm/distributed/device_communicators/custom_all_reduce.py (main, 00d618aa)
    sig = inspect.signature(TritonCommCustomAllreduce.__init__)
    assert list(sig.parameters) == ["self", "group", "device", "max_size", "symm_mem_enabled"]
    assert sig.parameters["max_size"].default == 8192 * 1024
    assert list(inspect.signature(TritonCommCustomAllreduce.all_reduce).parameters) == [
        "self", "inp", "out", "registered"]
    assert inspect.signature(TritonCommCustomAllreduce.all_reduce).parameters["out"].kind is \
        inspect.Parameter.KEYWORD_ONLY
    for name, params in {"should_custom_ar": ["self", "inp"], "custom_all_reduce": ["self", "input"],
                         "capture": ["self"], "close": ["self"], "finalize_p2p": ["self"]}.items():
        assert list(inspect.signature(getattr(TritonCommCustomAllreduce, name)).parameters) == params, name


def test_sglang_custom_allreduce_contract_is_pinned():
    sig = inspect.signature(SGLangCustomAllreduce.__init__)
    assert list(sig.parameters) == ["self", "group", "device", "max_size"]
    for name in ("should_custom_ar", "custom_all_reduce", "capture", "close"):
        assert callable(getattr(SGLangCustomAllreduce, name))


# ---------------------------------------------------------------------------- rank jobs

def _job_engine(ctx, deny_rank):
    import tritoncomm.integrations.capability as probe_mod

    real = probe_mod.local_peer_access
    if deny_rank is not None and ctx.rank == deny_rank:
        probe_mod.local_peer_access = lambda *a: [r if i != 0 else "no peer access (simulated)"
                                                  for i, r in enumerate(real(*a))]
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
        with ca.capture():
            z = ca.custom_all_reduce(x)
        res["same"] = same_on_all_ranks(ctx, z) and torch.equal(y, z)
    ca.close()
    return res


def test_vllm_adapter_serves_and_matches(worlds):
    for r in worlds(2).run(_job_engine, None):
        assert r == {"disabled": False, "should": True, "int_none": True, "none": False, "same": True}


def test_probe_vote_disables_everywhere_and_falls_back(worlds, caplog):
    for r in worlds(3).run(_job_engine, 1):
        assert r["disabled"] and r["none"] and not r["should"]


def _job_probe_reason(ctx):
    import tritoncomm.integrations.capability as probe_mod

    real = probe_mod.local_peer_access
    if ctx.rank == 2:
        probe_mod.local_peer_access = lambda *a: [r if i != 1 else "no peer access (simulated)"
                                                  for i, r in enumerate(real(*a))]
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

    def layer(a: torch.Tensor) -> torch.Tensor:
        h = torch.relu(a) * 2.0
        h = torch.ops.tritoncomm.all_reduce(h, name)
        torch.ops.tritoncomm.all_reduce_(h, name)
        return h + 1.0

    compiled = torch.compile(layer, fullgraph=True, backend=compile_backend)
    expect = reference_sum(ctx, torch.relu(x) * 2.0) * w + 1.0
    check_close(compiled(x), expect, torch.float32)
    check_close(compiled(x), expect, torch.float32)  # cached graph, second call
    enabled = gc.enabled
    return enabled


@pytest.mark.parametrize("compile_backend", ["aot_eager"])
def test_functional_api_and_custom_ops_under_compile(worlds, compile_backend):
    assert all(worlds(2).run(_job_functional_and_ops, compile_backend, timeout=900))


def _job_hierarchical(ctx):
    groups = ti.node_groups(local_world=2)
    har = ti.HierarchicalAllReduce(groups, max_bytes=1 << 20, device=ctx.device)
    bad = []
    for n in (1, 7, 1000, 4099):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n + ctx.rank)).to(ctx.device)
        out = har(x)
        ref = x.clone()
        dist.all_reduce(ref)
        try:
            check_close(out, ref, torch.float32)
        except AssertionError as e:
            bad.append((n, str(e)))
        if not same_on_all_ranks(ctx, out):
            bad.append((n, "ranks differ"))
    har.close()
    return (groups.node, groups.local_rank), bad


def test_hierarchical_allreduce_2x2(worlds):
    results = worlds(4).run(_job_hierarchical)
    assert [r[0] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r[1] == [] for r in results)
