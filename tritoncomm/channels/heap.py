"""The symmetric heap: one block of memory per rank, mapped by every rank, sub-allocated alike.

``HeapAllocator`` is pure bookkeeping (first fit, coalescing frees, fixed alignment). It is
deterministic, so ranks that make the same sequence of ``alloc``/``free`` calls get the same
offsets; ``SymmetricHeap.verify`` checks that they did. ``SymmetricHeap`` joins the allocator with a
``PeerMemory`` (CUDA IPC or POSIX shared memory) and the device table of peer base addresses.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import InvalidInputError, SetupMismatchError
from ..units import round_up
from .bootstrap import Bootstrap

__all__ = ["HEAP_ALIGN", "HeapAllocator", "PeerMemory", "Region", "SymmetricHeap"]

#: Alignment of every allocation, in bytes (16 is what vector accesses need; 256 keeps
#: allocations on separate cache lines and sectors).
HEAP_ALIGN = 256


@dataclass(frozen=True)
class Region:
    """``nbytes`` bytes at byte ``offset`` of every rank's heap."""

    offset: int
    nbytes: int
    tag: str = ""


class HeapAllocator:
    """First-fit allocator over ``[0, capacity)`` with coalescing free."""

    def __init__(self, capacity: int, align: int = HEAP_ALIGN) -> None:
        if align <= 0 or align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        self.capacity = capacity - capacity % align
        self.align = align
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # (offset, size), sorted
        self._live: dict[int, Region] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._round(r.nbytes) for r in self._live.values())

    @property
    def live(self) -> list[Region]:
        return sorted(self._live.values(), key=lambda r: r.offset)

    def _round(self, nbytes: int) -> int:
        return max(self.align, round_up(nbytes, self.align))

    def alloc(self, nbytes: int, tag: str = "") -> Region:
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        size = self._round(nbytes)
        for i, (off, avail) in enumerate(self._free):
            if avail >= size:
                if avail == size:
                    del self._free[i]
                else:
                    self._free[i] = (off + size, avail - size)
                region = Region(off, nbytes, tag)
                self._live[off] = region
                return region
        raise InvalidInputError(
            f"symmetric heap exhausted: need {size} bytes for {tag or 'an allocation'}, "
            f"{self.capacity - self.used_bytes} of {self.capacity} free (largest hole "
            f"{max((a for _, a in self._free), default=0)}); raise CommConfig.heap_bytes")

    def free(self, region: Region) -> None:
        if self._live.get(region.offset) != region:
            raise ValueError(f"{region} is not allocated here")
        del self._live[region.offset]
        off, size = region.offset, self._round(region.nbytes)
        i = bisect.bisect(self._free, (off, size))
        self._free.insert(i, (off, size))
        # coalesce with the next, then the previous hole
        if i + 1 < len(self._free) and off + size == self._free[i + 1][0]:
            self._free[i] = (off, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]


class PeerMemory(Protocol):
    """One heap per rank, mapped into every rank (set up collectively, closed collectively)."""

    nbytes: int
    #: ``peer_addrs[p]``: where this rank sees rank ``p``'s heap (its own included).
    peer_addrs: list[int]

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over bytes of this rank's own heap."""

    def peer_view(self, peer: int, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over bytes of ``peer``'s heap as this rank maps it (for copy-engine use)."""

    def close(self, barrier: Callable[[], None] | None = None) -> None:
        """Unmap peers, call ``barrier`` (every rank has unmapped), release this rank's heap."""


class SymmetricHeap:
    """A ``PeerMemory`` plus allocation and the device table of peer base addresses."""

    def __init__(self, memory: PeerMemory, device: torch.device, bootstrap: Bootstrap) -> None:
        self.memory = memory
        self.bootstrap = bootstrap
        self.allocator = HeapAllocator(memory.nbytes)
        #: int64 [world] table handed to kernels (``kernels.memory``).
        self.bases = torch.tensor(memory.peer_addrs, dtype=torch.int64, device=device)

    @property
    def nbytes(self) -> int:
        return self.memory.nbytes

    def alloc(self, nbytes: int, tag: str = "") -> Region:
        """Allocate on this rank. Every rank must make the same calls in the same order."""
        return self.allocator.alloc(nbytes, tag)

    def free(self, region: Region) -> None:
        self.allocator.free(region)

    def verify(self) -> None:
        """Collective: raise ``SetupMismatchError`` on every rank if the layouts differ."""
        layout = [(r.offset, r.nbytes, r.tag) for r in self.allocator.live]
        layouts = self.bootstrap.all_gather(layout)
        bad = [i for i, lay in enumerate(layouts) if lay != layouts[0]]
        if bad:
            raise SetupMismatchError(
                f"symmetric heap layouts differ between rank 0 and ranks {bad}: every rank must "
                f"create the same channels in the same order (rank 0: {layouts[0]}, "
                f"rank {bad[0]}: {layouts[bad[0]]})")

    def view(self, region: Region, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A tensor over ``region`` of this rank's heap (valid until the heap is closed)."""
        return self.memory.view(region.offset, region.nbytes).view(dtype)

    def peer_view(self, peer: int, region: Region, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A tensor over ``region`` of ``peer``'s heap, as mapped here. Plain torch copies through it
        use the copy engine; they are not ordered with any kernel's signals."""
        return self.memory.peer_view(peer, region.offset, region.nbytes).view(dtype)

    def peer_addr(self, peer: int, region: Region) -> int:
        return self.memory.peer_addrs[peer] + region.offset

    def close(self, barrier: Callable[[], None] | None = None) -> None:
        """Release the heap; ``barrier`` (default: the bootstrap's) runs between unmapping the
        peers and freeing this rank's memory."""
        self.memory.close(barrier or self.bootstrap.barrier)
