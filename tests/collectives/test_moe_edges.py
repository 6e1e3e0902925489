"""MoE dispatch and combine at the edges: the Lamport sentinels' values in the data, bad input raised
before any rank waits, host counters written only when they change, and a missing peer turned into a
named timeout, on every kind of dispatch path."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tritoncomm.collectives.moe import SHAPES, MoEAllToAll
from tritoncomm.errors import CommTimeoutError, InvalidInputError

from ..helpers import dealt, make_comm
from .moejob import job

#: The dispatch paths by launch shape (at most 4 tokens of top-2 per rank): the default (one kernel,
#: packets, at these sizes a routing copy per program, one program sending (in combine: pushing) and
#: the other laying out (summing)), the same with one shared copy, the same with both programs
#: sending then laying out (pushing then summing), one kernel with a
#: barrier, the send and gather kernels, the route and send kernels (plain, or with its rows as
#: packets and no barrier).
PATHS = {"one-kernel": None, "shared-copy": replace(SHAPES["cpu"], shared_copy_from=0),
         "whole-roles": replace(SHAPES["cpu"], send_programs=0, push_programs=0),
         "barrier": replace(SHAPES["cpu"], packets=False),
         "held": replace(SHAPES["cpu"], one_kernel=False),
         "routed": replace(SHAPES["cpu"], one_kernel=False, route_above=4),
         "routed-packets": replace(SHAPES["cpu"], one_kernel=False, route_above=4, routed_packets=True)}


@pytest.mark.parametrize("world,path,fp8", dealt([(p, f) for p in sorted(PATHS) for f in (False, True)], 3, 2))
def test_sentinel_values_in_the_data(worlds, world, path, fp8):
    """The Lamport sentinels' values in the tokens and weights (-0.0 in a third of the columns,
    subnormals, -0.0 weights, weights at the fp32 sentinel word): every dispatch path delivers -0.0
    as +0.0 (FP8 too) and the sentinel weight as -0.0, the rows bit for bit; combine exact; every
    Lamport buffer at rest after the calls."""
    for bad in worlds(world).run(job, 2 * world, 2, 256 if fp8 else 40, 4, "sentinels", 3, torch.bfloat16, None,
                                 torch.int64, torch.float32, fp8, "latency", shape=PATHS[path]):
        assert bad == []


def _bad_input(ctx, path: str):
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, shape=PATHS[path])
    dev, errs = ctx.device, []
    x = torch.zeros(3, 16, dtype=torch.bfloat16, device=dev)
    ids = torch.zeros(3, 2, dtype=torch.int64, device=dev)
    wts = torch.ones(3, 2, device=dev)
    for args in ((torch.zeros(5, 16, dtype=torch.bfloat16, device=dev), torch.zeros(5, 2, dtype=torch.int64,
                                                                                     device=dev), torch.ones(5, 2)),
                 (x.float(), ids, wts), (x, ids[:, :1], wts), (x, ids.float(), wts),
                 (torch.zeros(3, 32, dtype=torch.bfloat16, device=dev)[:, ::2], ids, wts)):
        try:
            moe.dispatch(*args)
            errs.append("no error")
        except InvalidInputError as e:
            errs.append(type(e).__name__)
    ids_bad = ids.clone()
    ids_bad[1, 0] = 99  # out of range: dropped now, reported at the next call
    ids_bad[0, 1] = 2 ** 32 + 1  # out of range as int64, though expert 1 once narrowed to int32
    ids_bad[2, 1] = -1  # "no expert": never reported
    out, counts, h = moe.dispatch(x, ids_bad, wts)
    # rank 0's experts 0 and 1: expert 0 has the entries (0, 0), (1, 1), (2, 0) of every rank, 1 none
    got = counts.tolist()
    errs.append("counts " + ("ok" if ctx.rank or got == [3 * ctx.world, 0] else str(got)))
    moe.combine(out, h)
    try:
        moe.dispatch(x, ids, wts)
        errs.append("no error")
    except InvalidInputError as e:
        errs.append("ids: " + ("2 expert ids outside" in str(e)) * "reported")
    _, _, h = moe.dispatch(x, ids, wts)  # the error was reported once; calls go on
    try:
        moe.combine(out, h)
        moe.combine(out, h)
        errs.append("no error")
    except InvalidInputError:
        errs.append("reused handle")
    for bad_args in (dict(num_experts=2 * ctx.world + 1), dict(top_k=0), dict(capacity=0), dict(dtype=torch.float32),
                     dict(mode="fast"), dict(throughput_from=-1), dict(shape=(2, 64, 64, 1)),
                     dict(decode_shape=replace(SHAPES["cpu"], programs=1 << 20)), dict(decode_below=-1)):
        try:
            MoEAllToAll(comm, **{**dict(max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2), **bad_args})
            errs.append("no error")
        except InvalidInputError:
            errs.append("ctor")
    moe.close()
    comm.close()
    return errs


@pytest.mark.parametrize("path", sorted(PATHS))
def test_bad_input_raises_before_waiting(worlds, path):
    """Bad arguments raise before any rank waits; ids out of range are dropped and reported at the
    next call, on every dispatch path."""
    for errs in worlds(2).run(_bad_input, path):
        assert errs == ["InvalidInputError"] * 5 + ["counts ok", "ids: reported", "reused handle"] + ["ctor"] * 9, errs


def _host_copy(ctx, path: str) -> list:
    """Calls without drops leave the host-mapped counters alone (a word poked on the host stays);
    a call with drops writes the drops' word, the cumulative count."""
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, capacity=2,
                      shape=PATHS[path])
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank)).to(torch.bfloat16).to(ctx.device)
    wts = torch.rand(4, 2).to(ctx.device)
    hot = torch.tensor([[0, 1]] * 4, device=ctx.device)  # experts 0 and 1, both rank 0's
    seen = []
    out, _, h = moe.dispatch(x[:1], hot[:1], wts[:1])  # two entries per expert: all kept
    moe.combine(out, h)
    comm.synchronize()  # on GPUs the host reads the words unsynchronised: wait for the calls before each look
    moe.memory.bad_host._array[1] = -7  # as if the drops' word held something else: only a write changes it
    out, _, h = moe.dispatch(x[:1], hot[:1], wts[:1])
    moe.combine(out, h)
    comm.synchronize()
    seen.append(moe.memory.bad_host.read())
    out, _, h = moe.dispatch(x, hot, wts)  # 4 * world entries per expert, 2 kept
    moe.combine(out, h)
    comm.synchronize()
    seen.append(moe.memory.bad_host.read())
    moe.close()
    comm.close()
    return seen


@pytest.mark.parametrize("path", ["one-kernel", "routed"])
def test_host_counters_written_only_when_they_change(worlds, path):
    """The dispatch copies its counters (bad ids, drops) into host-mapped words only where they
    changed: no host memory written by calls without either."""
    for rank, seen in enumerate(worlds(2).run(_host_copy, path)):
        assert seen == [[0, -7], [0, 2 * (4 * 2 - 2) if rank == 0 else -7]], seen


def _missing_peer(ctx, path: str):
    """Rank 1 builds the instance but never dispatches: rank 0's dispatch must end in a timeout
    that names both ranks (and, with packets, the elements still at the sentinel and their buffer)."""
    comm = make_comm(ctx, heap_bytes=16 << 20, timeout_s=1.0)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, shape=PATHS[path])
    err = None
    if ctx.rank == 0:
        dev = ctx.device
        ids = torch.tensor([[0, 2], [3, 1], [2, 0]], device=dev)  # experts on both ranks
        try:
            moe.dispatch(torch.ones(3, 16, dtype=torch.bfloat16, device=dev), ids, torch.ones(3, 2, device=dev))
            comm.synchronize()
        except CommTimeoutError as e:
            err = (e.rank, e.peer, str(e))
    comm.bootstrap.barrier()
    moe.close()
    comm.close()
    return err


@pytest.mark.parametrize("path", ["barrier", "held", "one-kernel", "routed"])  # each kind of wait
def test_missing_peer_turns_into_timeout_error(worlds, path):
    err, _ = worlds(2).run(_missing_peer, path, timeout=300)
    assert err is not None, "no CommTimeoutError on rank 0"
    rank, peer, msg = err
    assert (rank, peer) == (0, 1) and "rank 0" in msg and "peer 1" in msg, msg
    if path == "one-kernel":  # the data is the flag; the error names the buffer that waited
        assert "still at the sentinel" in msg and "user.empty(" in msg and "of rank 0)" in msg, msg
