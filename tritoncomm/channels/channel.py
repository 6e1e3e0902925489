"""Channels: private signal slots, epochs and buffers inside a communicator's heap.

Whoever launches kernels that synchronise (a collective, a user's fused kernel) on one stream owns
one channel. Two channels never share a flag, so two collectives on two streams, or two groups (two
communicators, two heaps), can run back to back or concurrently without confusing each other's
signals.

Layout in every rank's heap (same offsets everywhere):

* ``flags``: ``barrier_slots`` x ``MAX_WORLD`` uint32 flags, written by peers (``kernels.barrier``);
* ``epochs``: one uint32 per program, read and written only by this rank's program of that id;
* ``buffer``: ``buffer_bytes`` of scratch, written by peers (LL packets, staged data, ...).

Flags, epochs and the buffer are zeroed at creation, except the buffer's first ``lamport_bytes``,
which start at rest as Lamport buffers (``kernels.lamport``: every 16-bit half the sentinel).
Creation ends with a check that every rank built the same layout (which is also the barrier that
keeps peers from signalling or storing into memory that is still being zeroed or put at rest). The
buffer is zeroed because the heap is reused: a channel created where a closed one lived starts its
epochs at 1 again, and an LL packet the old one left there with flag 1 would otherwise pass for this
channel's (flag 0 never matches an epoch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..kernels.barrier import barrier_flag_bytes
from ..kernels.lamport import lamport_fill
from .heap import Region

if TYPE_CHECKING:  # the communicator creates channels (its debug channel); channels only use it
    from .communicator import Communicator

__all__ = ["Channel"]


class Channel:
    """Collective to create and to close; ``name`` tags the allocations in error messages."""

    def __init__(self, comm: Communicator, name: str, *, programs: int, barrier_slots: int = 0,
                 buffer_bytes: int = 0, lamport_bytes: int = 0) -> None:
        comm.require_open(f"channel {name}")
        if programs <= 0:
            raise ValueError("a channel needs at least one program")
        if not 0 <= lamport_bytes <= buffer_bytes or lamport_bytes % 16:
            raise ValueError(f"lamport_bytes must be a multiple of 16 within buffer_bytes ({buffer_bytes}), "
                             f"got {lamport_bytes}")
        self.comm = comm
        self.name = name
        self.programs = programs
        self.barrier_slots = barrier_slots
        heap = comm.heap
        self._regions: list[Region] = []
        try:
            self.epochs = self._alloc(4 * programs, "epochs")
            self.flags = self._alloc(barrier_flag_bytes(barrier_slots), "flags") if barrier_slots else None
            self.buffer = self._alloc(buffer_bytes, "buffer") if buffer_bytes else None
            for region in (self.epochs, self.flags, self.buffer):
                if region is not None:
                    heap.view(region).zero_()
            if lamport_bytes:
                lamport_fill(heap.view(self.buffer)[:lamport_bytes])
            if comm.backend == "cuda":
                torch.cuda.synchronize(comm.device)
            heap.verify()
        except BaseException:
            for region in self._regions:
                heap.free(region)
            raise

    def _alloc(self, nbytes: int, what: str) -> Region:
        region = self.comm.heap.alloc(nbytes, f"{self.name}.{what}")
        self._regions.append(region)
        return region

    @property
    def flags_off(self) -> int:
        return self.flags.offset if self.flags is not None else 0

    @property
    def epochs_off(self) -> int:
        return self.epochs.offset

    @property
    def buffer_off(self) -> int:
        return self.buffer.offset if self.buffer is not None else 0

    @property
    def buffer_bytes(self) -> int:
        return self.buffer.nbytes if self.buffer is not None else 0

    @property
    def heap_bytes(self) -> int:
        return sum(r.nbytes for r in self._regions)

    def close(self) -> None:
        """Collective: wait until no rank uses the channel, then return its memory to the heap.
        The wait is bounded (``Communicator.close_barrier``); once the communicator is closed the
        memory is gone anyway and nothing is waited for."""
        if not self._regions:
            return
        try:
            if not self.comm.closed:
                if self.comm.backend == "cuda" and not self.comm.broken:
                    torch.cuda.synchronize(self.comm.device)
                self.comm.close_barrier()
        finally:  # released here even when a peer never came (the communicator is then broken)
            for region in self._regions:
                self.comm.heap.free(region)
            self._regions = []
