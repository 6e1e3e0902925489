"""Fused all-reduce + residual add + RMSNorm (+ FP8) against the unfused reference."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc
from tritoncomm.collectives import FusedAllReduceAddRMSNorm

from .helpers import make_comm, reference_sum, same_on_all_ranks


def _reference(ctx, x, residual, weight, eps, gemma):
    summed = reference_sum(ctx, x).view(x.shape)  # fp32 sum over ranks
    new_res = (summed + residual.float()).to(x.dtype)
    v = new_res.float()
    y = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * ((1 + weight.float()) if gemma else weight.float())
    return new_res, y


def _job_fused(ctx, shapes, dtype, gemma, fp8):
    comm = make_comm(ctx)
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=64, max_hidden=4200)
    bad = []
    for t, h in shapes:
        g = torch.Generator().manual_seed(1000 * t + h + ctx.rank)
        x = torch.randn(t, h, generator=g).to(dtype).to(ctx.device)
        residual = torch.randn(t, h, generator=torch.Generator().manual_seed(t * h)).to(dtype).to(ctx.device)
        weight = (torch.rand(h, generator=torch.Generator().manual_seed(h)) + 0.5).to(dtype).to(ctx.device)
        exp_res, exp_y = _reference(ctx, x, residual, weight, 1e-6, gemma)
        scale = torch.tensor([0.05], device=ctx.device) if fp8 else None
        out = fused(x, residual, weight, gemma=gemma, fp8_scale=scale)
        comm.synchronize()
        if not torch.allclose(residual.float().cpu(), exp_res.float(), rtol=1e-2, atol=1e-2):
            bad.append((t, h, "residual"))
        if fp8:
            got = out.float().cpu() * 0.05
            want = (exp_y / 0.05).clamp(-448, 448) * 0.05
            ok = torch.allclose(got, want, rtol=0.13, atol=0.05 * 0.02)
        else:
            ok = torch.allclose(out.float().cpu(), exp_y, rtol=2e-2, atol=2e-2)
        if not ok:
            bad.append((t, h, "output"))
        if not (same_on_all_ranks(ctx, residual) and same_on_all_ranks(ctx, out.view(torch.uint8))):
            bad.append((t, h, "ranks differ"))
    fused.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_matches_unfused(worlds, world, dtype):
    for bad in worlds(world).run(_job_fused, [(1, 1000), (7, 4097), (33, 64)], dtype, False, False):
        assert bad == []


@pytest.mark.parametrize("gemma,fp8", [(True, False), (False, True)])
def test_fused_gemma_and_fp8(worlds, gemma, fp8):
    for bad in worlds(2).run(_job_fused, [(5, 1000), (2, 333)], torch.bfloat16, gemma, fp8):
        assert bad == []


def _job_fused_bad(ctx):
    comm = make_comm(ctx)
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=8, max_hidden=128)
    d = ctx.device
    x = torch.ones(4, 128, dtype=torch.bfloat16, device=d)
    r = torch.ones(4, 128, dtype=torch.bfloat16, device=d)
    w = torch.ones(128, dtype=torch.bfloat16, device=d)
    cases = {
        "shape": lambda: fused(x, torch.ones(4, 64, dtype=torch.bfloat16, device=d), w),
        "weight": lambda: fused(x, r, torch.ones(100, dtype=torch.bfloat16, device=d)),
        "hidden": lambda: fused(torch.ones(4, 256, dtype=torch.bfloat16, device=d),
                                torch.ones(4, 256, dtype=torch.bfloat16, device=d),
                                torch.ones(256, dtype=torch.bfloat16, device=d)),
        "dtype": lambda: fused(x.float(), r.float(), w.float()),
    }
    caught = {}
    for k, fn in cases.items():
        try:
            fn()
            caught[k] = None
        except tc.InvalidInputError as e:
            caught[k] = str(e)
    try:
        FusedAllReduceAddRMSNorm(comm, max_tokens=8, max_hidden=20000)
        caught["max_hidden"] = None
    except tc.InvalidInputError as e:
        caught["max_hidden"] = str(e)
    out = fused(x, r, w)  # still works
    comm.synchronize()
    ok = bool(torch.isfinite(out.float()).all())
    fused.close()
    comm.close()
    return caught, ok


def test_fused_bad_input(worlds):
    for caught, ok in worlds(2).run(_job_fused_bad):
        assert all(caught.values()), caught
        assert "does not match" in caught["shape"] and "weight" in caught["weight"]
        assert ok
