"""Communicators created and destroyed in rounds: what a rank holds before and after (``test_heap``, and
``test_reliability``'s hundred rounds)."""

from __future__ import annotations

import os

import torch

from tritoncomm.channels import Channel
from tritoncomm.channels.shm import SHM_PREFIX

from ..helpers import make_comm

__all__ = ["lifecycle_job", "segments"]


def segments() -> set[str]:
    """tritoncomm's shared-memory segments in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)} if os.path.isdir("/dev/shm") else set()


def lifecycle_job(ctx, rounds: int) -> tuple:
    """``rounds`` communicators (each with a channel) created, used and closed after a first one: what
    this rank held before and after them (its /dev/shm segments, file descriptors, threads, free device
    memory)."""
    import threading

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def free_device_memory() -> int:
        if ctx.backend != "cuda":
            return 0
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info(ctx.device)[0]

    names = []

    def one_round(i: int) -> None:
        comm = make_comm(ctx, heap_bytes=64 << 20)
        names.append(getattr(comm.heap.memory, "name", ""))
        assert not (segments() & set(names)), "segment left in /dev/shm after set-up"
        ch = Channel(comm, f"c{i}", programs=2, barrier_slots=2, buffer_bytes=4096)
        view = comm.heap.view(ch.buffer)
        view.fill_(i % 256)
        assert int(view[17]) == i % 256
        del view
        ch.close()
        assert comm.heap.allocator.used_bytes == 0
        comm.close()

    one_round(0)  # first use may start driver threads or caches; measure after it
    before = (segments(), fds(), threading.active_count(), free_device_memory())
    for i in range(1, rounds + 1):
        one_round(i)
    after = (segments(), fds(), threading.active_count(), free_device_memory())
    return before, after
