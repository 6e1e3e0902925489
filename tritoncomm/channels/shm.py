"""CPU world: each rank's heap is a POSIX shared-memory segment that every rank maps.

The segment is unlinked as soon as every rank has mapped it, so no name is left in ``/dev/shm``
even if a process dies later; the memory goes away with the last mapping.
"""

from __future__ import annotations

import _posixshmem
import ctypes
import mmap
import os
import uuid
from collections.abc import Callable

import torch

from .bootstrap import Bootstrap

__all__ = ["SHM_PREFIX", "ShmPeerMemory"]

#: Every segment name starts with this (tests look for leftovers by it).
SHM_PREFIX = "tritoncomm-"


def _map(name: str, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = _posixshmem.shm_open("/" + name, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class ShmPeerMemory:
    """``PeerMemory`` over POSIX shared memory (collective construction and close)."""

    def __init__(self, nbytes: int, bootstrap: Bootstrap) -> None:
        self.nbytes = nbytes
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        token = bootstrap.all_gather(uuid.uuid4().hex[:12])[0]
        self.name = f"{SHM_PREFIX}{token}-{os.getpid()}-r{self.rank}"
        self._maps: list[mmap.mmap] = []
        self._anchors: list[ctypes.Array] = []
        own = _map(self.name, nbytes, create=True)
        try:
            names = bootstrap.all_gather(self.name)
            for r, name in enumerate(names):
                mm = own if r == self.rank else _map(name, nbytes, create=False)
                self._maps.append(mm)
                self._anchors.append((ctypes.c_char * nbytes).from_buffer(mm))
            bootstrap.barrier()  # every rank has mapped every segment
        finally:
            _posixshmem.shm_unlink("/" + self.name)
        self.peer_addrs = [ctypes.addressof(a) for a in self._anchors]

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        return torch.frombuffer(self._anchors[self.rank], dtype=torch.uint8, count=nbytes, offset=offset)

    def peer_view(self, peer: int, offset: int, nbytes: int) -> torch.Tensor:
        return torch.frombuffer(self._anchors[peer], dtype=torch.uint8, count=nbytes, offset=offset)

    def close(self, barrier: Callable[[], None] | None = None) -> None:
        if not self._maps:
            return
        (barrier or self.bootstrap.barrier)()  # no rank still runs kernels on our memory
        self._anchors.clear()
        self.peer_addrs = []
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass  # a tensor view is still alive: the mapping goes when it does
        self._maps.clear()
