"""Bootstrap: timed barriers give up at each rank's own deadline, whoever is missing, and leave no
keys in the store when they pass."""

from __future__ import annotations

import time

from tritoncomm.channels import GroupBootstrap


def _job_timed_barrier(ctx, absent: int, timeout: float):
    boot = GroupBootstrap(ctx.cpu_group)
    names = boot.all_gather(f"r{ctx.rank}")
    for _ in range(3):
        boot.barrier(timeout=30.0)  # everyone arrives: returns
    boot.all_gather(None)  # every rank has left the timed barriers
    store = boot._store()
    left_keys = [store.check([f"{boot._prefix}/{i}{sfx}"]) for i in range(3) for sfx in ("", "/all", "/left")]
    t0 = time.monotonic()
    error = None
    if ctx.rank != absent:
        try:
            boot.barrier(timeout=timeout)
        except TimeoutError as e:
            error = str(e)
    waited = time.monotonic() - t0
    # the group is still usable: no gloo operation was left pending
    after = GroupBootstrap(ctx.cpu_group).all_gather(ctx.rank)
    return names, error, waited, after, left_keys


def test_timed_barrier_gives_up_on_every_rank_when_one_is_missing(worlds):
    timeout = 2.0
    for absent in (0, 2):  # rank 0 missing is the case gloo's monitored_barrier cannot bound
        results = worlds(3).run(_job_timed_barrier, absent, timeout)
        for rank, (names, error, waited, after, left_keys) in enumerate(results):
            assert names == ["r0", "r1", "r2"] and after == [0, 1, 2]
            assert not any(left_keys), left_keys  # the passed barriers' keys were deleted
            if rank == absent:
                continue
            assert error is not None and "2 of 3 ranks" in error and f"rank {rank}" in error, error
            assert timeout <= waited < timeout + 20, waited
