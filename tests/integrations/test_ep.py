"""The expert-parallel MoE layer against the same layer in one process with the full weights
(``moe_reference``): different token counts per rank, bf16 and FP8 dispatch, both combine modes,
repeated calls."""

from __future__ import annotations

import pytest
import torch

from tritoncomm.integrations import ExpertParallelMoE, moe_reference

from ..helpers import make_comm, world_sizes


def _job(ctx, fp8: bool, mode: str):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    experts, hidden, inter, k, max_tokens = 4 * ctx.world, 128, 64, 3, 8
    g = torch.Generator().manual_seed(5)  # the same full weights on every rank
    router = torch.randn(experts, hidden, generator=g)
    gate, up = (torch.randn(experts, inter, hidden, generator=g).div(hidden ** 0.5).to(torch.bfloat16)
                for _ in range(2))
    down = torch.randn(experts, hidden, inter, generator=g).div(inter ** 0.5).to(torch.bfloat16)
    layer = ExpertParallelMoE(comm, router, gate, up, down, top_k=k, max_tokens=max_tokens, fp8_dispatch=fp8,
                              mode=mode)
    errs = []
    for rep in range(3):
        gx = torch.Generator().manual_seed(100 * rep + ctx.rank)
        n = (rep + ctx.rank) % max_tokens + 1
        x = torch.randn(n, hidden, generator=gx).to(torch.bfloat16)
        out = layer(x.to(ctx.device), tokens_bound=max_tokens if rep == 1 else None).float().cpu()
        ref = moe_reference(x, router, gate, up, down, k).float()
        errs.append(((out - ref).abs().max() / ref.abs().max()).item())
    layer.close()
    comm.close()
    return errs


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("fp8,mode", [(False, "latency"), (False, "throughput"), (True, "auto")])
def test_layer_matches_single_process_reference(worlds, world, fp8, mode):
    tol = 0.08 if fp8 else 0.02  # e4m3 keeps 3 mantissa bits; bf16 GEMMs grouped differently
    for errs in worlds(world).run(_job, fp8, mode):
        assert max(errs) < tol, errs
