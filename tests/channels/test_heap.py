"""Symmetric heap: sub-allocation, alignment, reuse, layout checks and cleanup."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import tritoncomm as tc
from tritoncomm.channels import Channel, HeapAllocator

from ..helpers import make_comm
from .lifecycle import lifecycle_job


def test_allocations_are_aligned_and_disjoint():
    a = HeapAllocator(1 << 20)
    regions = [a.alloc(n, f"r{n}") for n in (1, 17, 256, 257, 4096, 3)]
    for r in regions:
        assert r.offset % 256 == 0
    spans = sorted((r.offset, r.offset + r.nbytes) for r in regions)
    assert all(e0 <= s1 for (_, e0), (s1, _) in itertools.pairwise(spans))


def test_free_space_is_reused_and_coalesced():
    a = HeapAllocator(4096)
    r1, r2, r3 = a.alloc(1024), a.alloc(1024), a.alloc(1024)
    a.free(r2)
    assert a.alloc(1000).offset == r2.offset  # first fit reuses the hole
    a.free(r1)
    a.free(a.live[0])  # the 1000-byte block at r2's offset
    big = a.alloc(2048)  # r1 and r2 holes coalesced
    assert big.offset == 0
    a.free(big)
    a.free(r3)
    assert a.used_bytes == 0
    assert a.alloc(4096).offset == 0


def test_exhaustion_and_bad_free_raise():
    a = HeapAllocator(4096)
    a.alloc(4000)
    with pytest.raises(tc.InvalidInputError, match="heap exhausted"):
        a.alloc(512)
    with pytest.raises(ValueError):
        a.free(tc.channels.Region(512, 10))


def test_same_sequence_gives_same_offsets():
    def run() -> list[int]:
        a = HeapAllocator(1 << 16)
        xs = [a.alloc(n) for n in (100, 3000, 7, 900)]
        a.free(xs[1])
        xs.append(a.alloc(1500))
        return [r.offset for r in a.live]

    assert run() == run()


def test_create_and_destroy_leaks_nothing(worlds):
    for before, after in worlds(2).run(lifecycle_job, 20):
        assert after[0] <= before[0], "shared-memory segments leaked"
        assert after[1] <= before[1], f"file descriptors leaked: {before[1]} -> {after[1]}"
        assert after[2] <= before[2], "threads leaked"
        assert before[3] - after[3] < 32 << 20, f"device memory leaked: {before[3] - after[3]} bytes"


def _job_layout_mismatch(ctx):
    comm = make_comm(ctx)
    try:
        Channel(comm, "c", programs=1, buffer_bytes=1024 * (1 + ctx.rank))
    except tc.SetupMismatchError as e:
        return str(e)
    finally:
        comm.close()
    return None


def test_layout_mismatch_raises_on_every_rank(worlds):
    for msg in worlds(2).run(_job_layout_mismatch):
        assert msg is not None and "layouts differ" in msg


def _job_view(ctx):
    comm = make_comm(ctx)
    ch = Channel(comm, "v", programs=1, buffer_bytes=64)
    v = comm.heap.view(ch.buffer, torch.float32)
    v.copy_(torch.arange(16, dtype=torch.float32) + ctx.rank)
    comm.bootstrap.barrier()
    peer = (ctx.rank + 1) % ctx.world
    addr = comm.heap.peer_addr(peer, ch.buffer)
    ch.close()
    comm.close()
    return addr != 0


def test_heap_views_and_peer_addresses(worlds):
    assert all(worlds(2).run(_job_view))


def test_debug_signature_words_name_every_op_and_dtype():
    """The debug-mode mismatch message reads op and dtype names from the same tables that make the
    signatures (every collective's op is there)."""
    from tritoncomm.kernels.consistency import DTYPE_CODES, OP_CODES, code_name

    for op in ("allreduce", "allgather", "reducescatter", "fused_add_rmsnorm", "gemm_allreduce"):
        assert code_name(0, OP_CODES[op]) == op
    for dtype, code in DTYPE_CODES.items():
        assert code_name(1, code) == dtype
    assert code_name(2, 12345) == "12345" and code_name(0, 77) == "77"


class _PeerDiesBeforeTheBarrier:
    """Rank 0's view of a two-rank set-up whose rank 1 creates its segment, sends its name and dies
    before the barrier (a stand-in bootstrap: no processes)."""

    world, rank = 2, 0

    def __init__(self) -> None:
        self.token: str | None = None

    def all_gather(self, obj):
        import _posixshmem

        from tritoncomm.channels.shm import segment_name

        if self.token is None:  # the first exchange draws the token (rank 0's)
            self.token = obj
            return [obj, "unused"]
        peer = segment_name(self.token, 1)
        fd = _posixshmem.shm_open("/" + peer, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # as rank 1 made it
        os.ftruncate(fd, 1 << 20)
        os.close(fd)
        return [obj, peer]

    def barrier(self, timeout=None):
        raise RuntimeError("rank 1 is gone")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_set_up_that_fails_leaves_no_segment_not_even_the_dead_ranks():
    from tritoncomm.channels.shm import ShmPeerMemory

    boot = _PeerDiesBeforeTheBarrier()
    with pytest.raises(RuntimeError, match="rank 1 is gone"):
        ShmPeerMemory(1 << 20, boot)
    assert boot.token and not [n for n in os.listdir("/dev/shm") if boot.token in n]
