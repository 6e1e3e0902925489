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


def _mismatched(ctx, algo: str, case: str):
    comm = make_comm(ctx, timeout_s=20.0 if ctx.backend == "cuda" else 120.0)
    ar = tc.AllReduce(comm, max_bytes=64 << 10, algos=(algo,))
    n, dtype = CASES[case][0 if ctx.rank == 0 else 1]
    g = torch.Generator().manual_seed(7 + ctx.rank)
    x = torch.randn(n, generator=g).to(dtype).to(ctx.device)
    out = torch.full_like(x, float("nan"))
    said = {}
    try:
        ar(x, out, algo=algo)
        comm.synchronize()
        said["call"] = "returned"
    except CollectiveMismatchError as e:
        said["call"] = str(e)
    said["untouched"] = bool(torch.isnan(out.float()).all())
    try:  # the communicator stays broken
        ar(x, out, algo=algo)
        said["next"] = "returned"
    except TritonCommError as e:
        said["next"] = type(e).__name__
    ar.close()
    comm.close()
    return said


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("algo", ["oneshot", "twoshot"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_mismatched_call_raises_on_every_rank_and_writes_nothing(worlds, world, algo, case):
    for rank, said in enumerate(worlds(world).run(_mismatched, algo, case)):
        assert "called different collectives" in said["call"] and "allreduce" in said["call"], (rank, said)
        assert said["untouched"] and said["next"] == "CollectiveMismatchError", (rank, said)
        (n0, d0), (n1, d1) = CASES[case]
        for n, d in ((n0, d0), (n1, d1)):
            assert f"x {n}," in said["call"] and {torch.float32: "fp32", torch.bfloat16: "bf16",
                                                  torch.float16: "fp16"}[d] in said["call"], (rank, said)
