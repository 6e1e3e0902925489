"""Reliability: debug-mode consistency checks, stress with stragglers, killed ranks, fuzzing."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import time

import pytest
import torch

import tritoncomm as tc
from tritoncomm.launch import RankError

from ..channels.lifecycle import lifecycle_job
from ..conftest import BACKEND, new_world
from ..helpers import make_comm, small_table, world_sizes

# --------------------------------------------------------------------------------------------
# debug mode: mismatched calls raise on every rank, and the communicator stays usable

def _job_mismatch(ctx):
    comm = make_comm(ctx, debug=True)
    ar = tc.AllReduce(comm, max_bytes=1 << 16, table=small_table(ctx.world))
    ag = tc.AllGather(comm, max_bytes=1 << 16)
    caught = []
    cases = [
        lambda: ar(torch.ones(100 + (ctx.rank == 1), device=ctx.device)),  # element count
        lambda: ar(torch.ones(64, device=ctx.device, dtype=torch.float32 if ctx.rank else torch.bfloat16)),
        lambda: ar(torch.ones(64, device=ctx.device)) if ctx.rank else ag(torch.ones(32, device=ctx.device)),
        lambda: ar(torch.ones(64, device=ctx.device), algo="oneshot" if ctx.rank else "twoshot"),
    ]
    for case in cases:
        try:
            case()
            comm.synchronize()
            caught.append(None)
        except tc.CollectiveMismatchError as e:
            caught.append((e.field, e.peer, str(e)))
    x = torch.full((1000,), float(ctx.rank + 1), device=ctx.device)
    ok = torch.equal(ar(x).cpu(), torch.full((1000,), float(sum(range(1, ctx.world + 1)))))
    comm.synchronize()
    ar.close()
    ag.close()
    comm.close()
    return caught, ok


def test_debug_mode_catches_mismatched_calls_on_every_rank(worlds):
    for caught, ok in worlds(3).run(_job_mismatch):
        assert [c[0] if c else None for c in caught] == ["element count", "dtype", "op", "algorithm"]
        assert ok, "communicator unusable after a caught mismatch"


def _job_moe_mismatch(ctx):
    """Debug mode checks the MoE calls too: a rank that passes another token bound, or dispatches while
    the others combine, raises on every rank, and the instance stays usable; token counts may differ."""
    comm = make_comm(ctx, debug=True)
    moe = tc.MoEAllToAll(comm, max_tokens=8, hidden=64, num_experts=2 * ctx.world, top_k=2)
    g = torch.Generator().manual_seed(ctx.rank)
    n = 3 + ctx.rank  # a different token count on every rank: allowed
    x = torch.randn(n, 64, generator=g).to(torch.bfloat16).to(ctx.device)
    ids = torch.rand(n, 2 * ctx.world, generator=g).topk(2).indices.to(ctx.device)
    w = torch.rand(n, 2, generator=g).to(ctx.device)
    caught = []
    for case in ("bound", "op"):
        try:
            if case == "bound":
                moe.dispatch(x, ids, w, tokens_bound=8 if ctx.rank == 0 else 7)
            else:
                _, _, h = moe.dispatch(x, ids, w)  # the same call on every rank
                if ctx.rank == 0:
                    moe.dispatch(x, ids, w)
                else:
                    moe.combine(moe.expert_buffer(), h)
            comm.synchronize()
            caught.append(None)
        except tc.CollectiveMismatchError as e:
            caught.append(e.field)
    _, _, h = moe.dispatch(x, ids, w)
    out = moe.combine(moe.expert_buffer(), h)
    comm.synchronize()
    usable = tuple(out.shape) == (n, 64)
    moe.close()
    comm.close()
    return caught, usable


def test_debug_mode_catches_mismatched_moe_calls_on_every_rank(worlds):
    for caught, usable in worlds(2).run(_job_moe_mismatch):
        assert caught == ["element count", "op"], caught
        assert usable


def _job_zero_elements(ctx):
    """A call with no elements is a no-op on every rank; in debug mode it takes part in the signature
    check, so a rank passing none where another passes some raises on both and later calls pair as
    they should (the sums below would be off by a call otherwise)."""
    comm = make_comm(ctx, debug=True)
    ar, ag = tc.AllReduce(comm, max_bytes=1 << 16), tc.AllGather(comm, max_bytes=1 << 16)
    dev, r = ctx.device, ctx.rank
    ar(torch.ones(0, device=dev))  # every rank: nothing moves, nothing waits
    ag(torch.ones(0, device=dev))
    caught = []
    for case in (lambda: ar(torch.ones(0 if r == 0 else 10, device=dev)),
                 lambda: ag(torch.ones(0 if r == 1 else 8, device=dev))):
        try:
            case()
            comm.synchronize()
            caught.append(None)
        except tc.CollectiveMismatchError as e:
            caught.append(e.field)
    sums = [ar(torch.full((100,), float(r + k), device=dev))[0].item() for k in (1, 10)]
    ar.close()
    ag.close()
    comm.close()
    return caught, sums


def test_zero_element_calls_are_checked_in_debug_mode(worlds):
    for caught, sums in worlds(3).run(_job_zero_elements):
        assert caught == ["element count", "element count"], caught
        assert sums == [float(sum(r + k for r in range(3))) for k in (1, 10)], sums


# --------------------------------------------------------------------------------------------
# stress: many back-to-back calls of random sizes over every algorithm, with stragglers

def _expected(ranks_data: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    acc = torch.zeros_like(ranks_data[0], dtype=torch.float32)
    for d in ranks_data:  # the kernels' order: ranks 0..W-1, fp32
        acc = acc + d.float()
    return acc.to(dtype)


def _job_stress(ctx, calls, seed, stragglers):
    comm = make_comm(ctx, timeout_s=60)
    ar = tc.AllReduce(comm, max_bytes=1 << 17, table=small_table(ctx.world))
    ar2 = tc.AllReduce(comm, max_bytes=1 << 17, table=small_table(ctx.world), name="second")
    schedule = random.Random(seed)  # the same sequence on every rank
    mismatches, algos, details = 0, set(), []
    cuda = ctx.backend == "cuda"
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if cuda else None
    for i in range(calls):
        n = schedule.choice([1, 7, 100, 1000, 2049, 5000, 7000, 9000, 20000])
        dtype = schedule.choice([torch.bfloat16, torch.float16, torch.float32])
        which = schedule.randrange(2)
        late = schedule.randrange(ctx.world) if stragglers and schedule.random() < 0.05 else -1
        data = [torch.randn(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + i * 10 + r)).to(dtype)
                for r in range(ctx.world)]
        if late == ctx.rank:
            time.sleep(schedule.random() * 0.02)
        elif late >= 0:
            schedule.random()  # keep the sequence aligned across ranks
        x = data[ctx.rank].to(ctx.device)
        out = torch.full_like(x, float("nan"))
        coll = (ar, ar2)[which]
        if cuda:
            with torch.cuda.stream(streams[which]):
                coll(x, out=out)
            streams[which].synchronize()
        else:
            coll(x, out=out)
        algo = coll.select(x.numel() * x.element_size(), dtype)
        algos.add(algo)
        want = _expected(data, dtype)
        if not torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)):
            mismatches += 1
            if len(details) < 3:  # what a failure needs to be chased: the call, its algorithm, the first bad values
                got = out.cpu()
                bad = (got.view(torch.uint8).view(-1, x.element_size()) != want.view(torch.uint8).view(
                    -1, x.element_size())).any(dim=1).nonzero().flatten()
                details.append({"rank": ctx.rank, "call": i, "n": n, "dtype": str(dtype), "instance": which,
                                "algo": algo, "late": late, "elements": len(bad), "first": bad[:4].tolist(),
                                "got": got[bad[:4]].tolist(), "want": want[bad[:4]].tolist()})
    comm.synchronize()
    ar.close()
    ar2.close()
    comm.close()
    return mismatches, sorted(algos), details


@pytest.mark.parametrize("world,gpu_calls,cpu_calls", [(2, 10_000, 100), (3, 600, 120), (4, 400, 40)])
def test_stress_random_sizes_with_stragglers(worlds, world, gpu_calls, cpu_calls):
    """Full length on GPUs; in the CPU world (CI) 100 / 120 / 40 calls at world 2 / 3 / 4, each enough
    (with its seed) to meet every algorithm."""
    calls = gpu_calls if BACKEND == "cuda" else cpu_calls
    for mismatches, algos, details in worlds(world).run(_job_stress, calls, 2026 + world, True, timeout=3000):
        assert mismatches == 0, "\n".join(map(str, details))
        assert algos == sorted(tc.collectives.ALGORITHMS)


# --------------------------------------------------------------------------------------------
# a rank dies in the middle of a loop: the others raise the timeout error and exit cleanly

def _job_killed_rank(ctx, victim, after, timeout_s):
    comm = make_comm(ctx, timeout_s=timeout_s)
    ar = tc.AllReduce(comm, max_bytes=1 << 16, table=small_table(ctx.world))
    x = torch.ones(3000, device=ctx.device)
    t0 = None
    try:
        for i in range(after + 50):
            if ctx.rank == victim and i == after:
                os._exit(17)  # dies without a word, holding its heap
            if i == after:
                t0 = time.monotonic()
            ar(x)
            comm.synchronize()
    except tc.CommTimeoutError as e:
        elapsed = time.monotonic() - t0
        t1 = time.monotonic()
        ar.close()
        comm.close()  # bounded: the communicator is broken
        closed = time.monotonic() - t1
        raise RuntimeError(f"TIMEOUT peer={e.peer} rank={e.rank} after {elapsed:.2f}s, "
                           f"closed in {closed:.2f}s") from e
    return "no error"


def test_killed_rank_turns_into_timeout_errors_on_the_others():
    # CPU world: the bound counts interpreted spins (0.25 s -> 500 spins, several seconds of wall
    # time), far above what a live peer needs
    timeout_s = 3.0 if BACKEND == "cuda" else 0.25
    with new_world(3) as w:
        with pytest.raises(RankError) as info:
            w.run(_job_killed_rank, 2, 5, timeout_s, timeout=300)
    failures = info.value.failures
    assert "died" in failures[2] or "exited" in failures[2]
    for r in (0, 1):
        assert r in failures, f"rank {r} did not report the dead peer"
        assert "TIMEOUT" in failures[r], failures[r][-500:]
        found = re.search(r"TIMEOUT peer=\d+ rank=\d+ after ([\d.]+)s, closed in ([\d.]+)s", failures[r])
        assert found, failures[r][-500:]
        if BACKEND == "cuda":
            assert float(found.group(1)) < 3 * timeout_s + 5
        # each close step waits at most BROKEN_CLOSE_WAIT_S for the others, on every rank
        assert float(found.group(2)) < 3 * tc.Communicator.BROKEN_CLOSE_WAIT_S + 10


# --------------------------------------------------------------------------------------------
# lifecycle: 100 communicators created and destroyed

def test_create_destroy_100_times_leaks_nothing(worlds):
    for before, after in worlds(2).run(lifecycle_job, 100, timeout=900):
        assert after[0] <= before[0] and after[1] <= before[1] and after[2] <= before[2]
        assert before[3] - after[3] < 32 << 20


def _job_not_one_node(ctx):
    from tritoncomm.channels import topology

    real = topology.rank_info
    if ctx.rank == 1:
        topology.rank_info = lambda backend, device: dataclasses.replace(real(backend, device), host="other-host")
    try:
        make_comm(ctx)
    except tc.PeerAccessError as e:
        return str(e)
    finally:
        topology.rank_info = real
    return None


def test_group_spanning_hosts_is_refused_on_every_rank(worlds):
    for msg in worlds(2).run(_job_not_one_node):
        assert msg and "another host" in msg


def _job_reused_heap_region(ctx, kind, algo):
    """A collective created where a closed one lived (the heap's first fit gives it the same
    offsets) must not take the old one's packets for its own: its epochs restart at 1, so an LL
    packet the old one left with flag 1 would match. Rank 0 calls the new one first and its peers
    2 s later, so rank 0 polls before any new packet arrives."""
    from tritoncomm.collectives import FusedAllReduceAddRMSNorm

    from ..helpers import check_close, reference_sum

    comm = make_comm(ctx)
    errs = []
    h = 64
    for rnd in range(2):
        if kind == "allreduce":
            op = tc.AllReduce(comm, max_bytes=1 << 14, algos=(algo,))
        else:
            op = FusedAllReduceAddRMSNorm(comm, max_tokens=4, max_hidden=h, algos=(algo,))
        g = torch.Generator().manual_seed(100 * rnd + ctx.rank)
        x = (torch.randn(4 * h, generator=g) * (1 + 3 * rnd)).to(torch.bfloat16).to(ctx.device)
        if rnd == 1 and ctx.rank != 0:
            time.sleep(2.0)
        if kind == "allreduce":
            out = torch.full_like(x, float("nan"))
            op(x, out=out, algo=algo)
            comm.synchronize()
            ref = reference_sum(ctx, x)
        else:
            res = torch.ones(4, h, dtype=torch.bfloat16, device=ctx.device)
            w = torch.ones(h, dtype=torch.bfloat16, device=ctx.device)
            op(x.view(4, h), res, w, algo=algo)
            comm.synchronize()
            out, ref = res.view(-1), reference_sum(ctx, x) + 1
        try:
            check_close(out, ref, torch.bfloat16)
        except AssertionError as e:
            errs.append(f"round {rnd}: {e}")
        op.close()
    comm.close()
    return errs


@pytest.mark.parametrize("kind,algo", [("allreduce", "ll"), ("allreduce", "ll_twoshot"),
                                       ("fused", "ll"), ("fused", "ll_twoshot")])
def test_new_collective_in_a_reused_heap_region_ignores_old_packets(worlds, kind, algo):
    errs = worlds(2).run(_job_reused_heap_region, kind, algo)
    assert errs == [[], []], errs


# --------------------------------------------------------------------------------------------
# GPU: the Lamport algorithms under stragglers, calls queued back to back with no host sync

def _job_lamport_stragglers(ctx, calls, seed):
    comm = make_comm(ctx, timeout_s=60)
    ar = tc.AllReduce(comm, max_bytes=8 << 20, algos=("lamport", "lamport_twoshot"))
    schedule = random.Random(seed)  # the same sequence on every rank
    plan, outs = [], []
    for i in range(calls):
        n = schedule.choice([1, 7, 4096, 33333, 200_000, 1 << 20, 3_000_000])
        algo = schedule.choice(["lamport", "lamport_twoshot"])
        late = schedule.randrange(ctx.world) if schedule.random() < 0.2 else -1
        cycles = schedule.randrange(1, 2_000_000)
        g = torch.Generator(device=ctx.device).manual_seed(seed * 1_000_003 + i * 16 + ctx.rank)
        x = torch.randn(n, device=ctx.device, generator=g).to(torch.bfloat16)
        if late == ctx.rank:
            torch.cuda._sleep(cycles)  # this rank's stream falls behind; nobody waits on the host
        outs.append(ar(x, algo=algo if n * 2 <= ar.capacity[algo] else "lamport_twoshot"))
        plan.append(n)
    comm.synchronize()
    mismatches = 0
    for i, (n, out) in enumerate(zip(plan, outs, strict=True)):
        acc = torch.zeros(n, device=ctx.device)
        for r in range(ctx.world):  # every rank's input, regenerated; summed in rank order as the kernels do
            g = torch.Generator(device=ctx.device).manual_seed(seed * 1_000_003 + i * 16 + r)
            acc += torch.randn(n, device=ctx.device, generator=g).to(torch.bfloat16).float()
        mismatches += int(not torch.equal(out.view(torch.int16), acc.to(torch.bfloat16).view(torch.int16)))
    ar.close()
    comm.close()
    return mismatches


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_lamport_stragglers_random_sizes_no_sync(worlds, world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"world {world} needs {world} GPUs: ranks sharing a GPU do not straggle on their own streams")
    for mismatches in worlds(world).run(_job_lamport_stragglers, 400, 7, timeout=300):
        assert mismatches == 0
