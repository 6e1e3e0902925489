"""Mismatched calls without debug mode: the barriers compare every call's signature (op, dtype, element
count, algorithm), so a rank that calls something else than its peers never gets a silently wrong
result. Every rank raises ``CollectiveMismatchError`` naming both signatures, no output is written,
and the communicator stays broken."""

from __future__ import annotations

import pytest
import torch

import tritoncomm as tc
from tritoncomm.errors import CollectiveMismatchError, TritonCommError

from ..helpers import make_comm, world_sizes

#: (name, rank 0's call, the other ranks' call): element count and dtype of each.
CASES = {
    "count": ((1024, torch.float32), (2048, torch.float32)),
    "dtype": ((1024, torch.bfloat16), (1024, torch.float16)),
    "both": ((2048, torch.bfloat16), (1024, torch.float32)),
}


#: The calls under test: (the op's name in the error, what to build, how to call it).
CALLS = {
    "allreduce-oneshot": ("allreduce", lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("oneshot",)),
                          lambda c, x: c(x, algo="oneshot")),
    "allreduce-twoshot": ("allreduce", lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("twoshot",)),
                          lambda c, x: c(x, algo="twoshot")),
    "allgather": ("allgather", lambda comm: tc.AllGather(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "reducescatter": ("reducescatter", lambda comm: tc.ReduceScatter(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "alltoall": ("alltoall", lambda comm: tc.AllToAll(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "fused-oneshot": ("fused_add_rmsnorm", lambda comm: _fused(comm, "oneshot"), lambda c, x: _norm(c, x, "oneshot")),
    "fused-twoshot": ("fused_add_rmsnorm", lambda comm: _fused(comm, "twoshot"), lambda c, x: _norm(c, x, "twoshot")),
}
#: The fused norm's rows are this wide.
HIDDEN = 64


def _call_of(call: str, rank: int, case: str, world: int) -> tuple[int, torch.dtype]:
    """Rank ``rank``'s element count and dtype in ``case`` (the fused norm takes bf16 for fp32)."""
    n, dtype = CASES[case][0 if rank == 0 else 1]
    if call.startswith("fused") and dtype == torch.float32:
        dtype = torch.bfloat16
    return n // 8 * world, dtype  # a multiple of the world (reduce-scatter, all-to-all), about a kilo-element


def _fused(comm, algo: str):
    from tritoncomm.collectives.fused_norm import FusedAllReduceAddRMSNorm

    return FusedAllReduceAddRMSNorm(comm, max_tokens=64, max_hidden=HIDDEN, algos=(algo,))


def _norm(c, x: torch.Tensor, algo: str, out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    rows = x.view(-1, HIDDEN)
    return c(rows, torch.ones_like(rows), torch.ones(HIDDEN, dtype=x.dtype, device=x.device), algo=algo, out=out,
             residual_out=residual_out)


def _mismatched(ctx, call: str, case: str):
    comm = make_comm(ctx, timeout_s=20.0 if ctx.backend == "cuda" else 120.0)
    _, build, run = CALLS[call]
    coll = build(comm)
    n, dtype = _call_of(call, ctx.rank, case, ctx.world)
    g = torch.Generator().manual_seed(7 + ctx.rank)
    x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
    said = {}
    out = None
    try:
        out = run(coll, x)
        comm.synchronize()
        said["call"] = "returned"
    except CollectiveMismatchError as e:
        said["call"] = str(e)
    said["n"] = n // ctx.world if call in ("reducescatter", "alltoall") else n  # the count each call names
    try:  # the communicator stays broken
        run(coll, x)
        said["next"] = "returned"
    except TritonCommError as e:
        said["next"] = type(e).__name__
    coll.close()
    comm.close()
    return said, out


def _untouched(ctx, call: str, case: str):
    """With an output given, poisoned: nothing written into it."""
    comm = make_comm(ctx, timeout_s=20.0 if ctx.backend == "cuda" else 120.0)
    _, build, _ = CALLS[call]
    coll = build(comm)
    n, dtype = _call_of(call, ctx.rank, case, ctx.world)
    x = torch.randn(n, generator=torch.Generator().manual_seed(3 + ctx.rank)).to(dtype).to(ctx.device)
    out = torch.full({"allgather": (n * ctx.world,), "reducescatter": (n // ctx.world,)}.get(call, (n,)),
                     float("nan"), dtype=dtype, device=ctx.device)
    residual_out = torch.full((n // HIDDEN, HIDDEN), float("nan"), dtype=dtype, device=ctx.device)
    try:
        if call.startswith("allreduce"):
            coll(x, out, algo=call.split("-")[1])
        elif call.startswith("fused"):
            _norm(coll, x, call.split("-")[1], out.view(-1, HIDDEN), residual_out)
        else:
            coll(x, out)
        comm.synchronize()
    except CollectiveMismatchError:
        pass
    untouched = bool(torch.isnan(out.float()).all() and torch.isnan(residual_out.float()).all())
    coll.close()
    comm.close()
    return untouched


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_mismatched_call_raises_on_every_rank_and_writes_nothing(worlds, world, call, case):
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    results = worlds(world).run(_mismatched, call, case)
    counts = {r: said["n"] for r, (said, _) in enumerate(results)}
    for rank, (said, _) in enumerate(results):
        assert "called different collectives" in said["call"] and CALLS[call][0] in said["call"], (rank, said)
        assert said["next"] == "CollectiveMismatchError", (rank, said)
        here, there = said["call"].split(" here, ")
        other = 1 if rank == 0 else 0
        assert f"x {counts[rank]}," in here and names[_call_of(call, rank, case, world)[1]] in here, (rank, said)
        assert f"x {counts[other]}," in there and names[_call_of(call, other, case, world)[1]] in there, (rank, said)
    assert all(worlds(world).run(_untouched, call, case))
