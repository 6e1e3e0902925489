"""Bad input raises a clear error on every rank before anyone waits; dead peers raise, not hang."""

from __future__ import annotations

import time

import pytest
import torch

import tritoncomm as tc

from ..conftest import BACKEND, SHARED_GPUS
from ..helpers import make_comm


def _job_bad_inputs(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=4096)
    dev = ctx.device
    cases = {
        "dtype": lambda: ar(torch.ones(8, dtype=torch.int32, device=dev)),
        "op": lambda: ar(torch.ones(8, device=dev), op="max"),
        "contiguous": lambda: ar(torch.ones(8, 8, device=dev).t()),
        "too_large": lambda: ar(torch.ones(4097, device=dev)),
        "device": lambda: ar(torch.ones(8, device="meta")),
        "out_shape": lambda: ar(torch.ones(8, device=dev), out=torch.ones(9, device=dev)),
        "algo": lambda: ar(torch.ones(8, device=dev), algo="ring"),
        "not_tensor": lambda: ar([1.0, 2.0]),
        # torch itself refuses misaligned views; a buffer at an odd address makes one (CPU world only)
        "misaligned": lambda: ar(torch.frombuffer(bytearray(64), dtype=torch.float16, offset=1, count=8)
                                 if dev.type == "cpu" else torch.ones(8, dtype=torch.int32, device=dev)),
    }
    caught = {}
    for name, fn in cases.items():
        try:
            fn()
            caught[name] = None
        except tc.InvalidInputError as e:
            caught[name] = str(e)
    # the communicator still works afterwards: nobody waited on anybody
    x = torch.ones(16, device=dev)
    ok = torch.equal(ar(x).cpu(), torch.full((16,), float(ctx.world)))
    comm.synchronize()
    ar.close()
    comm.close()
    return caught, ok


def test_bad_inputs_raise_before_waiting(worlds):
    for caught, ok in worlds(2).run(_job_bad_inputs):
        for name, msg in caught.items():
            assert msg, f"{name}: no InvalidInputError"
        assert "not supported" in caught["dtype"] and "int32" in caught["dtype"]
        assert "contiguous" in caught["contiguous"]
        assert "exceed" in caught["too_large"]
        assert "meta" in caught["device"]
        assert "aligned" in caught["misaligned"] or "not supported" in caught["misaligned"]
        assert ok


def _job_heap_too_small(ctx):
    comm = make_comm(ctx, heap_bytes=1 << 20)
    try:
        tc.AllReduce(comm, max_bytes=1 << 20)
    except tc.InvalidInputError as e:
        return str(e)
    finally:
        comm.close()
    return None


def test_workspace_larger_than_heap_raises(worlds):
    for msg in worlds(2).run(_job_heap_too_small):
        assert msg and "heap exhausted" in msg


def _job_no_peer_access(ctx):
    from tritoncomm.channels import topology

    if ctx.rank == 1:  # this rank cannot reach rank 0
        real = topology.local_peer_access

        def fake(backend, device, infos, rank, **kwargs):
            out = real(backend, device, infos, rank, **kwargs)
            out[0] = "no peer access (simulated)"
            return out

        topology.local_peer_access = fake
    try:
        make_comm(ctx)
    except tc.PeerAccessError as e:
        return str(e)
    finally:
        if ctx.rank == 1:
            topology.local_peer_access = real
    return None


def test_world_without_peer_access_raises_on_every_rank(worlds):
    for msg in worlds(3).run(_job_no_peer_access):
        assert msg and "rank 1 -> rank 0" in msg and "simulated" in msg


def _job_config_mismatch(ctx):
    try:
        make_comm(ctx, timeout_s=10.0 + ctx.rank)
    except tc.SetupMismatchError as e:
        return str(e)
    return None


def test_config_mismatch_raises_on_every_rank(worlds):
    assert all(worlds(2).run(_job_config_mismatch))


def _job_dead_peer(ctx, algo):
    comm = make_comm(ctx, timeout_s=1.0)
    ar = tc.AllReduce(comm, max_bytes=1 << 16, algos=tuple(tc.collectives.ALGORITHMS))
    err = None
    t0 = time.monotonic()
    if ctx.rank == 0:  # rank 1 never joins this all-reduce
        x = torch.ones(1000, device=ctx.device)
        try:
            ar(x, algo=algo)
            comm.synchronize()
        except tc.CommTimeoutError as e:
            err = (e.rank, e.peer, e.slot, e.expected, e.seen, str(e))
        try:  # the communicator stays failed
            ar(x, algo=algo)
            err = (*err, "second call did not raise")
        except tc.CommTimeoutError:
            pass
    elapsed = time.monotonic() - t0
    comm.bootstrap.barrier()
    comm.close()
    return err, elapsed


@pytest.mark.parametrize("algo", list(tc.collectives.ALGORITHMS))
def test_dead_peer_turns_into_timeout_error(worlds, algo):
    (err, elapsed), _ = worlds(2).run(_job_dead_peer, algo, timeout=300)
    assert err is not None, "no CommTimeoutError on rank 0"
    rank, peer, slot, expected, seen, msg = err
    assert (rank, peer) == (0, 1)
    if algo.startswith("lamport"):  # the data is the flag: the record counts elements still missing, and where
        assert expected != 0 and seen > 0 and "still at the sentinel" in msg and "heap offset" in msg, msg
    else:
        assert expected == 1 and seen != 1
    assert "rank 0" in msg and "peer 1" in msg and f"slot {slot}" in msg
    # the 1 s bound is wall-clock time in both worlds (the CPU world's interpreter reads the host's clock; ranks
    # sharing a GPU with other jobs take turns)
    assert 1.0 <= elapsed < (3.0 if BACKEND == "cuda" and not SHARED_GPUS else 8.0), elapsed


def _job_use_after_close(ctx):
    """Every use of a closed collective or communicator raises ``TritonCommError`` naming what is
    closed: no KeyError or IndexError from inside."""
    from tritoncomm.errors import TritonCommError

    comm = make_comm(ctx)
    x = torch.ones(64, device=ctx.device)
    ar, ag = tc.AllReduce(comm, max_bytes=4096), tc.AllGather(comm, max_bytes=4096)
    moe = tc.MoEAllToAll(comm, max_tokens=4, hidden=64, num_experts=2 * ctx.world, top_k=2)
    ar.close()
    ag.close()
    moe.close()
    moe.close()  # idempotent
    said = {}
    for what, call in {"ar(x)": lambda: ar(x), "ag(x)": lambda: ag(x),
                       "moe.dispatch": lambda: moe.dispatch(torch.ones(1, 64, device=ctx.device, dtype=torch.bfloat16),
                                                            torch.zeros(1, 2, dtype=torch.int64, device=ctx.device),
                                                            torch.ones(1, 2, device=ctx.device))}.items():
        try:
            call()
            said[what] = "no error"
        except TritonCommError as e:
            said[what] = str(e)
    comm.close()
    for what, call in {"AllReduce(comm)": lambda: tc.AllReduce(comm), "comm.empty": lambda: comm.empty(8),
                       "comm.register": lambda: comm.register(x), "MoEAllToAll(comm)": lambda: tc.MoEAllToAll(
                           comm, max_tokens=4, hidden=64, num_experts=2 * ctx.world, top_k=2)}.items():
        try:
            call()
            said[what] = "no error"
        except TritonCommError as e:
            said[what] = str(e)
    return said


def test_use_after_close_is_a_clear_error(worlds):
    for said in worlds(2).run(_job_use_after_close):
        assert said["ar(x)"] == "allreduce is closed" and said["ag(x)"] == "allgather is closed", said
        assert said["moe.dispatch"] == "MoEAllToAll is closed", said
        for what in ("AllReduce(comm)", "comm.empty", "comm.register", "MoEAllToAll(comm)"):
            assert said[what].endswith("the communicator is closed"), (what, said)


def _job_close_with_a_gone_peer(ctx):
    """Rank 1 never comes to close: rank 0's ``close`` of a collective returns within its bound
    (the wait bound plus a minute) with a CommTimeoutError naming rank 1, and the communicator's close
    then releases and unmaps this rank's memory at once."""
    comm = make_comm(ctx, timeout_s=1.0)
    ar = tc.AllReduce(comm, max_bytes=4096)
    if ctx.rank == 1:
        return None  # gone, as far as rank 0 can tell
    t0 = time.monotonic()
    try:
        ar.close()
        said = "returned"
    except tc.CommTimeoutError as e:
        said = (e.rank, e.peer, "rank(s) [1]" in str(e))
    waited = time.monotonic() - t0
    t0 = time.monotonic()
    comm.close()
    return said, waited, time.monotonic() - t0, comm.closed, comm.heap.memory.peer_addrs


def test_close_with_a_gone_peer_is_bounded_and_names_it(worlds):
    result, _ = worlds(2).run(_job_close_with_a_gone_peer, timeout=300)
    said, waited, closing, closed, addrs = result
    assert said == (0, 1, True), said
    assert 61 <= waited < 90 and closing < 5 and closed and addrs == [], (waited, closing, closed, addrs)


def _job_watchdog(ctx):
    """Rank 1 skips one all-reduce; rank 0 calls nothing after its timed-out call (no ``check``): its
    watchdog logs the timeout, naming rank, peer and slot, within a few periods."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("tritoncomm").addHandler(handler)
    comm = make_comm(ctx, timeout_s=1.0, watchdog_s=0.25)
    ar = tc.AllReduce(comm, max_bytes=4096)
    fired_after = None
    if ctx.rank == 0:
        ar(torch.ones(64, device=ctx.device))  # returns; on GPUs the kernel is still waiting
        t0 = time.monotonic()
        while comm.watchdog.fired is None and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        fired_after = time.monotonic() - t0
    logged = [r.getMessage() for r in records if r.getMessage().startswith("tritoncomm watchdog")]
    comm.bootstrap.barrier()
    try:
        comm.close()
    except tc.CommTimeoutError:
        pass
    logging.getLogger("tritoncomm").removeHandler(handler)
    return fired_after, logged


def test_the_watchdog_logs_a_recorded_timeout_within_seconds(worlds):
    (fired_after, logged), (_, quiet) = worlds(2).run(_job_watchdog, timeout=300)
    assert fired_after is not None and fired_after < 5 and not quiet, (fired_after, quiet)
    assert len(logged) == 1 and "rank 0 waiting for peer 1 (slot" in logged[0], logged


def _abort_job(ctx):
    comm = make_comm(ctx, timeout_s=1.0, watchdog_s=0.25, abort_on_timeout=True)
    ar = tc.AllReduce(comm, max_bytes=4096)
    if ctx.rank == 0:
        ar(torch.ones(64, device=ctx.device))
        time.sleep(30)  # the watchdog ends this process first
    return "still here"


def test_abort_on_timeout_ends_the_process():
    from tritoncomm.launch import LocalWorld, RankError

    with LocalWorld(2, BACKEND, shared_gpus=BACKEND == "cuda") as world:
        t0 = time.monotonic()
        with pytest.raises(RankError, match=r"rank 0 (exited|died)"):  # SIGABRT, long before its sleep ends
            world.run(_abort_job, timeout=120)
        assert time.monotonic() - t0 < 25
