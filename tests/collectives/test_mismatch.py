"""Mismatched calls without debug mode: the barriers compare every call's signature (op, dtype, element
count, algorithm), so a rank that calls something else than its peers never gets a silently wrong
result. Every rank raises ``CollectiveMismatchError`` naming both signatures, no output is written,
and the communicator stays broken."""

from __future__ import annotations

import dataclasses

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
    "allreduce-ll": ("allreduce", lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("ll",)),
                     lambda c, x: c(x, algo="ll")),
    "allreduce-ll_twoshot": ("allreduce", lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("ll_twoshot",)),
                             lambda c, x: c(x, algo="ll_twoshot")),
    "allreduce-lamport": ("allreduce", lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("lamport",)),
                          lambda c, x: c(x, algo="lamport")),
    "allreduce-lamport_twoshot": ("allreduce",
                                  lambda comm: tc.AllReduce(comm, max_bytes=64 << 10, algos=("lamport_twoshot",)),
                                  lambda c, x: c(x, algo="lamport_twoshot")),
    "allgather": ("allgather", lambda comm: tc.AllGather(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "reducescatter": ("reducescatter", lambda comm: tc.ReduceScatter(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "alltoall": ("alltoall", lambda comm: tc.AllToAll(comm, max_bytes=64 << 10), lambda c, x: c(x)),
    "fused-oneshot": ("fused_add_rmsnorm", lambda comm: _fused(comm, "oneshot"), lambda c, x: _norm(c, x, "oneshot")),
    "fused-twoshot": ("fused_add_rmsnorm", lambda comm: _fused(comm, "twoshot"), lambda c, x: _norm(c, x, "twoshot")),
    "fused-ll": ("fused_add_rmsnorm", lambda comm: _fused(comm, "ll"), lambda c, x: _norm(c, x, "ll")),
    "fused-ll_twoshot": ("fused_add_rmsnorm", lambda comm: _fused(comm, "ll_twoshot"),
                         lambda c, x: _norm(c, x, "ll_twoshot")),
    "fused-lamport": ("fused_add_rmsnorm", lambda comm: _fused(comm, "lamport"), lambda c, x: _norm(c, x, "lamport")),
    "gemm-overlap": ("gemm_allreduce", lambda comm: _gemm(comm), lambda c, x: _gemm_call(c, x)),
}
#: The fused norm's rows are this wide.
HIDDEN = 64
#: The GEMM's input and output features (a multiple of 8, as its TMA loads need).
GEMM_N = 16


def _call_of(call: str, rank: int, case: str, world: int) -> tuple[int, torch.dtype]:
    """Rank ``rank``'s element count and dtype in ``case`` (the fused norm and the GEMM take bf16 for
    fp32)."""
    n, dtype = CASES[case][0 if rank == 0 else 1]
    if call.startswith(("fused", "gemm")) and dtype == torch.float32:
        dtype = torch.bfloat16
    return n // 8 * world, dtype  # a multiple of the world (reduce-scatter, all-to-all), about a kilo-element


def _fused(comm, algo: str):
    from tritoncomm.collectives.fused_norm import FusedAllReduceAddRMSNorm

    return FusedAllReduceAddRMSNorm(comm, max_tokens=64, max_hidden=HIDDEN, algos=(algo,))


def _norm(c, x: torch.Tensor, algo: str, out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    rows = x.view(-1, HIDDEN)
    return c(rows, torch.ones_like(rows), torch.ones(HIDDEN, dtype=x.dtype, device=x.device), algo=algo, out=out,
             residual_out=residual_out)


def _gemm(comm):
    from tritoncomm.collectives.gemm import GemmAllReduce

    return GemmAllReduce(comm, max_tokens=256, n=GEMM_N)


def _gemm_call(c, x: torch.Tensor, out: torch.Tensor | None = None):
    """The overlapped GEMM + all-reduce with an output of ``x``'s element count: ``x`` as rows of
    ``GEMM_N`` input features, times a fixed ``GEMM_N x GEMM_N`` weight."""
    rows = x.view(-1, GEMM_N)
    w = torch.linspace(-1, 1, GEMM_N * GEMM_N).view(GEMM_N, GEMM_N).to(x.dtype).to(x.device)
    return c(rows, w, path="overlap", out=None if out is None else out.view(-1, GEMM_N))


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


def _into_poison(ctx, call: str, n: int, dtype: torch.dtype, seed: int) -> tuple[str, bool]:
    """``call`` on a fresh communicator with poisoned outputs given: ``("ok" or "CollectiveMismatchError",
    whether the outputs stayed poisoned)``."""
    comm = make_comm(ctx, timeout_s=20.0 if ctx.backend == "cuda" else 120.0)
    coll = CALLS[call][1](comm)
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + ctx.rank)).to(dtype).to(ctx.device)
    out = torch.full({"allgather": (n * ctx.world,), "reducescatter": (n // ctx.world,)}.get(call, (n,)),
                     float("nan"), dtype=dtype, device=ctx.device)
    residual_out = torch.full((n // HIDDEN, HIDDEN), float("nan"), dtype=dtype, device=ctx.device)
    what = "ok"
    try:
        if call.startswith("allreduce"):
            coll(x, out, algo=call.split("-")[1])
        elif call.startswith("fused"):
            _norm(coll, x, call.split("-")[1], out.view(-1, HIDDEN), residual_out)
        elif call.startswith("gemm"):
            _gemm_call(coll, x, out)
        else:
            coll(x, out)
        comm.synchronize()
    except CollectiveMismatchError:
        what = "CollectiveMismatchError"
    untouched = bool(torch.isnan(out.float()).all() and torch.isnan(residual_out.float()).all())
    coll.close()
    comm.close()
    return what, untouched


def _untouched(ctx, call: str, case: str):
    """With an output given, poisoned: nothing written into it."""
    return _into_poison(ctx, call, *_call_of(call, ctx.rank, case, ctx.world), 3)[1]


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


#: Dtypes the random draws take (the fused norm's draws take only the 16-bit ones).
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _one(g: torch.Generator, unit: int, dtypes: tuple[torch.dtype, ...]) -> tuple[int, torch.dtype]:
    n = unit * int(torch.randint(1, 9, (1,), generator=g))
    return n, dtypes[int(torch.randint(len(dtypes), (1,), generator=g))]


def _draws(seed: int, world: int, count: int) -> list[tuple[str, tuple[int, torch.dtype], tuple[int, torch.dtype]]]:
    """``count`` draws, the same on every rank: a collective, rank 0's (elements, dtype) and the
    other ranks'; about one in four draws is the same call on every rank."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        call = list(CALLS)[int(torch.randint(len(CALLS), (1,), generator=g))]
        dtypes = DTYPES[:2] if call.startswith(("fused", "gemm")) else DTYPES
        unit = HIDDEN * world  # whole rows of the fused norm, shards of the reduce-scatter and all-to-all

        first = _one(g, unit, dtypes)
        out.append((call, first, first if int(torch.randint(4, (1,), generator=g)) == 0 else _one(g, unit, dtypes)))
    return out


def _random_job(ctx, seed: int, count: int):
    """Every draw on a fresh communicator: what each call raised (or "ok"), and whether a poisoned
    output stayed untouched when it raised a mismatch."""
    seen = []
    for call, first, other in _draws(seed, ctx.world, count):
        what, untouched = _into_poison(ctx, call, *(first if ctx.rank == 0 else other), seed)
        seen.append((what, untouched if what != "ok" else True))
    return seen


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
def test_random_mismatches_never_give_a_silent_result(worlds, world):
    """The randomized suite: collectives, element counts and dtypes drawn per call (rank 0's and
    the others'); every mismatched call raises on every rank and writes nothing, every matched one
    returns."""
    count = 24
    seed = 1000 + world
    results = worlds(world).run(_random_job, seed, count)
    for i, (call, first, other) in enumerate(_draws(seed, world, count)):
        want = "ok" if first == other else "CollectiveMismatchError"
        for rank, seen in enumerate(results):
            assert seen[i] == (want, True), (i, call, first, other, rank, seen[i])


def _checked_and_unchecked(ctx):
    """The same calls on a communicator with the call check and one without (``check_calls``): the
    same bits, and no signature compared without it."""
    same = {}
    comms = {on: make_comm(ctx, check_calls=on) for on in (True, False)}
    n = HIDDEN * ctx.world * 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(5 + ctx.rank)).to(torch.bfloat16).to(ctx.device)
    for call in CALLS:
        outs = {}
        for on, comm in comms.items():
            coll = CALLS[call][1](comm)
            outs[on] = CALLS[call][2](coll, x).clone()
            coll.close()
        same[call] = torch.equal(outs[True], outs[False])
    for comm in comms.values():
        comm.close()
    return same


def test_unchecked_kernels_give_the_same_bits(worlds):
    for same in worlds(2).run(_checked_and_unchecked):
        assert all(same.values()), same


def _changing_calls(ctx, rounds: int):
    """Matched calls that change from one call to the next (size, dtype), back to back on one
    instance each: none may be taken for a mismatch (a peer that has passed a barrier may arrive at it
    again, for its next call, before this rank has read the signature: ``kernels.barrier``)."""
    comm = make_comm(ctx)
    colls = {call: CALLS[call][1](comm) for call in ("allreduce-oneshot", "allgather", "fused-oneshot")}
    bad = []
    for i in range(rounds):
        n = HIDDEN * ctx.world * (1 + i % 3)
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        x = torch.ones(n, dtype=dtype, device=ctx.device) * (ctx.rank + 1)
        for call, coll in colls.items():
            try:
                out = CALLS[call][2](coll, x)
                comm.check()
            except TritonCommError as e:
                bad.append((i, call, str(e)[:120]))
                break
            if call == "allreduce-oneshot" and not bool((out == ctx.world * (ctx.world + 1) // 2).all()):
                bad.append((i, call, "wrong sum"))
    comm.synchronize()
    for coll in colls.values():
        coll.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_changing_matched_calls_are_never_taken_for_mismatches(worlds, world):
    for bad in worlds(world).run(_changing_calls, 12):
        assert bad == []


def _moe_mismatched(ctx, case: str, max_tokens: int, mode: str) -> tuple[str, str, str, list[int]]:
    """MoE dispatch and combine without debug mode, with rank 0's call differing from the others':
    ``bound``, another ``tokens_bound`` (every rank within it); ``over``, a peer with more tokens than
    rank 0's bound; ``path``, rank 0 without a bound (an instance's whole size: its two-kernel path)
    against a small one (the one-kernel path). What the pair of calls raised on this rank (or
    "returned"), the message, the path this rank took and its experts' counts after."""
    comm = make_comm(ctx, timeout_s=8.0)
    moe = tc.MoEAllToAll(comm, max_tokens=max_tokens, hidden=64, num_experts=2 * ctx.world, top_k=2, mode=mode)
    n = {"bound": 3 + ctx.rank, "over": 4 if ctx.rank == 0 else 6, "path": 3}[case]
    bound = {"bound": 8 if ctx.rank == 0 else 7, "over": n, "path": None if ctx.rank == 0 else 8}[case]
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(n, 64, generator=g).to(torch.bfloat16).to(ctx.device)
    ids = torch.rand(n, 2 * ctx.world, generator=g).topk(2).indices.to(ctx.device)
    w = torch.rand(n, 2, generator=g).to(ctx.device)
    path = moe.dispatch_path(bound)[0]
    moe.memory.counts.fill_(-5)  # poisoned: a call that finds another call leaves every count 0
    try:
        _, _, h = moe.dispatch(x, ids, w, tokens_bound=bound)
        moe.combine(moe.expert_buffer(), h)
        comm.synchronize()
        said, text = "returned", ""
    except TritonCommError as e:
        said, text = type(e).__name__, str(e)
    counts = moe.memory.counts.cpu().tolist()
    moe.close()
    comm.close()
    return said, text, path, counts


@pytest.mark.parametrize(("world", "case", "max_tokens", "mode"), [
    (2, "bound", 8, "auto"), (3, "bound", 8, "auto"), (2, "over", 8, "auto"), (2, "bound", 4096, "throughput"),
    (2, "path", 4096, "auto")])
def test_mismatched_moe_calls_raise_on_every_rank(worlds, world, case, max_tokens, mode):
    """The dispatch's kernels compare the call's signature (op, dtype, the shared token bound, the
    path): a rank whose call differs raises CollectiveMismatchError naming both calls (with another
    bound, every rank: the routing copies are polled with the headers), and a rank left waiting for
    what a different call never sends raises CommTimeoutError. No rank returns, on the
    one-kernel Lamport path (``max_tokens`` 8, or small bounds) and across paths (``path``)."""
    results = worlds(world).run(_moe_mismatched, case, max_tokens, mode)
    said = [r[0] for r in results]
    assert all(s in ("CollectiveMismatchError", "CommTimeoutError") for s in said), results
    if case == "bound":  # every rank names both calls, the one with the larger bound too, and keeps no row
        assert all(s == "CollectiveMismatchError" for s in said), results
        assert all("moe_dispatch bf16 x 7" in t and "moe_dispatch bf16 x 8" in t for _, t, _, _ in results), results
        assert all(c == [0] * len(c) for *_, c in results), results
    if case == "path":
        assert results[0][2] != results[1][2], results  # the two ranks took different paths


#: The two-kernel dispatch paths, as ``MoEShape`` changes of the CPU shape: the send and gather kernels
#: (too few entries to route), the route and send kernels, and those with the rows as packets (no send
#: barrier: the route kernel's compares).
TWO_KERNEL_PATHS = {"send-gather": dict(one_kernel=False),
                    "routed": dict(one_kernel=False, route_above=4, block_e=4, super_blocks=2),
                    "routed-packets": dict(one_kernel=False, route_above=4, block_e=4, super_blocks=2,
                                           packets=True, routed_packets=True)}


def _moe_two_kernel_mismatched(ctx, kind: str) -> tuple[str, bool, str]:
    """A two-kernel dispatch path (``TWO_KERNEL_PATHS``) with another token bound on rank 0: what the
    call raised, whether the poisoned expert buffer stayed poisoned (every token goes to the next
    rank's experts: no own rows here, all from a peer) with every count 0, and the path."""
    from tritoncomm.collectives.moe import SHAPES

    comm = make_comm(ctx, timeout_s=8.0)
    shape = dataclasses.replace(SHAPES["cpu"], **TWO_KERNEL_PATHS[kind])
    moe = tc.MoEAllToAll(comm, max_tokens=8, hidden=64, num_experts=2 * ctx.world, top_k=2, shape=shape)
    g = torch.Generator().manual_seed(ctx.rank)
    n = 3
    x = torch.randn(n, 64, generator=g).to(torch.bfloat16).to(ctx.device)
    ids = torch.tensor([[(ctx.rank + 1) % ctx.world * 2, (ctx.rank + 1) % ctx.world * 2 + 1]] * n).to(ctx.device)
    w = torch.rand(n, 2, generator=g).to(ctx.device)  # every token to the next rank's experts only
    bound = 8 if ctx.rank == 0 else 7
    experts = moe.buffers()["experts"]
    experts.view(torch.uint8).fill_(0x7F)
    moe.memory.counts.fill_(-5)  # poisoned: a mismatched call leaves every count 0
    try:
        moe.dispatch(x, ids, w, tokens_bound=bound)
        comm.synchronize()
        said = "returned"
    except TritonCommError as e:
        said = type(e).__name__
    untouched = bool((experts.view(torch.uint8) == 0x7F).all()) and bool((moe.memory.counts == 0).all())
    path = moe.dispatch_path(bound)[0]
    moe.close()
    comm.close()
    return said, untouched, path


@pytest.mark.parametrize("kind", list(TWO_KERNEL_PATHS))
def test_a_mismatched_two_kernel_dispatch_lays_out_nothing(worlds, kind):
    """Every two-kernel path compares the call's signature at a barrier (the send kernel's, or with
    routed packets the route kernel's) and lays out nothing from the peers where it differs."""
    for said, untouched, path in worlds(2).run(_moe_two_kernel_mismatched, kind):
        assert path == kind.replace("-packets", ""), path
        assert said == "CollectiveMismatchError" and untouched, (said, untouched)
