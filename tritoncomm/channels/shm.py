"""CPU world: each rank's heap is a POSIX shared-memory segment that every rank maps.

The segment is unlinked as soon as every rank has mapped it, so no name is left in ``/dev/shm``
even if a process dies later; the memory goes away with the last mapping. A set-up that fails (a
peer died before every rank had mapped every segment) unlinks every rank's segment this rank can
name, so a dead rank's segment does not outlive it: names are the communicator's token and the rank.
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

__all__ = ["SHM_PREFIX", "ShmPeerMemory", "segment_name"]

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


def segment_name(token: str, rank: int) -> str:
    """The segment of ``rank`` in the communicator whose set-up drew ``token``."""
    return f"{SHM_PREFIX}{token}-r{rank}"


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


class ShmPeerMemory:
    """``PeerMemory`` over POSIX shared memory (collective construction and close)."""

    def __init__(self, nbytes: int, bootstrap: Bootstrap) -> None:
        self.nbytes = nbytes
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        token = bootstrap.all_gather(uuid.uuid4().hex[:12])[0]
        self.name = segment_name(token, self.rank)
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
        except BaseException:
            for r in range(bootstrap.world):  # a peer may have died holding its segment: unlink them all
                _unlink(segment_name(token, r))
            self._anchors.clear()
            for mm in self._maps:
                mm.close()
            raise
        finally:
            _unlink(self.name)
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
