"""Integrations: probe and fallback, engine adapter contracts, functional API, custom ops under
torch.compile, hierarchical all-reduce at 2 x 2."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

import tritoncomm as tc
import tritoncomm.integrations as ti
from tritoncomm.integrations import SGLangCustomAllreduce, TritonCommCustomAllreduce

from ..helpers import check_close, reference_sum, same_on_all_ranks

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


# ---------------------------------------------------------------------------- vLLM device communicator

VLLM_FUSED_PARAMS = ["self", "allreduce_in", "residual", "rms_gamma", "rms_eps", "world_size", "launch_with_pdl",
                     "fp32_acc", "max_token_num", "pattern_code", "norm_out", "quant_out", "scale_out", "scale_factor",
                     "weight_bias"]


class _StandInCudaCommunicator:
    """vLLM's ``CudaCommunicator`` constructor and the two methods we override (from its source);
    ``all_reduce`` here is gloo, so that falling through to the base is visible."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name=""):
        self.cpu_group, self.device, self.device_group, self.unique_name = cpu_group, device, device_group, unique_name
        self.world_size = dist.get_world_size(cpu_group)
        self.base_calls = 0
        self.destroyed = False

    def all_reduce(self, input_):
        self.base_calls += 1
        out = input_.cpu().clone()
        dist.all_reduce(out, group=self.cpu_group)
        return out.to(input_.device)

    def destroy(self):
        self.destroyed = True


def test_vllm_device_communicator_and_fused_entry_contracts_are_pinned():
    from tritoncomm.integrations.vllm import VllmFusedAllReduceNorm, make_device_communicator

    cls = make_device_communicator(_StandInCudaCommunicator)
    assert issubclass(cls, _StandInCudaCommunicator)
    assert list(inspect.signature(cls.__init__).parameters) == ["self", "cpu_group", "device", "device_group",
                                                               "unique_name"]
    assert list(inspect.signature(cls.all_reduce).parameters) == ["self", "input_"]
    sig = inspect.signature(VllmFusedAllReduceNorm.__call__)
    assert list(sig.parameters) == VLLM_FUSED_PARAMS
    assert sig.parameters["weight_bias"].default == 0.0 and sig.parameters["norm_out"].default is None


def _job_vllm_communicator(ctx):
    from tritoncomm.integrations.vllm import make_device_communicator

    cls = make_device_communicator(_StandInCudaCommunicator)
    tp = cls(ctx.cpu_group, ctx.device, None, unique_name="tp:0")
    pp = cls(ctx.cpu_group, ctx.device, None, unique_name="pp:0")
    x = torch.randn(3000, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    ref = reference_sum(ctx, x)
    res = {"tp_served": tp.tc_comm is not None, "pp_served": pp.tc_comm is not None}
    check_close(tp.all_reduce(x), ref, torch.float32)
    check_close(pp.all_reduce(x), ref, torch.float32)
    res["tp_base_calls"], res["pp_base_calls"] = tp.base_calls, pp.base_calls
    # the fused entry, both of vLLM's conventions and Gemma's weight bias
    res["fused_ready"] = tp.setup_fused_allreduce_norm(max_token_num=8, hidden_size=96)
    g = torch.Generator().manual_seed(40 + ctx.rank)
    a0 = torch.randn(5, 96, generator=g).to(torch.bfloat16).to(ctx.device)
    r0 = torch.randn(5, 96, generator=torch.Generator().manual_seed(41)).to(torch.bfloat16).to(ctx.device)
    w = torch.rand(96, generator=torch.Generator().manual_seed(42)).to(torch.bfloat16).to(ctx.device)
    summed = reference_sum(ctx, a0)
    new_res = (summed + r0.float().cpu()).to(torch.bfloat16).float()
    wc = w.float().cpu()
    normed = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6)
    a, r = a0.clone(), r0.clone()
    tp.fused_allreduce_norm(a, r, w, 1e-6, ctx.world, True, True, 8, 1)
    res["in_place"] = bool(torch.allclose(a.float().cpu(), normed * wc, rtol=2e-2, atol=2e-2)
                           and torch.allclose(r.float().cpu(), new_res, rtol=1e-2, atol=1e-2))
    a, r, y = a0.clone(), r0.clone(), torch.empty_like(a0)
    tp.fused_allreduce_norm(allreduce_in=a, residual=r, rms_gamma=w, rms_eps=1e-6, world_size=ctx.world,
                            launch_with_pdl=False, fp32_acc=True, max_token_num=8, pattern_code=1, norm_out=y,
                            weight_bias=1.0)
    res["norm_out_gemma"] = bool(torch.allclose(y.float().cpu(), normed * (1 + wc), rtol=2e-2, atol=2e-2)
                                 and torch.allclose(a.float().cpu(), new_res, rtol=1e-2, atol=1e-2)
                                 and torch.equal(r, r0))
    try:
        tp.fused_allreduce_norm(a, r, w, 1e-6, ctx.world, True, True, 8, 3)
        res["fp4_refused"] = False
    except tc.InvalidInputError:
        res["fp4_refused"] = True
    tp.destroy()
    pp.destroy()
    res["destroyed"] = tp.destroyed and tp.tc_comm is None
    return res


def test_vllm_device_communicator_serves_tp_and_falls_through(worlds):
    for r in worlds(2).run(_job_vllm_communicator):
        assert r == {"tp_served": True, "pp_served": False, "tp_base_calls": 0, "pp_base_calls": 1,
                     "fused_ready": True, "in_place": True, "norm_out_gemma": True, "fp4_refused": True,
                     "destroyed": True}
