"""Copies into peers' heaps by the copy engine, on a stream of their own.

A kernel's stores to a peer cross NVLink from the SMs, which then do nothing else; a copy engine
moves the same bytes while every SM runs other work (measured on two H200s: 388-395 GB/s from 16
MB, against 345-353 for SM stores; ``docs/performance.md``, "Primitives, two GPUs").

``CopyEngine(comm)`` holds a side stream. ``copy_rows(dst_addr, src)`` copies the rows of ``src``
(a 2-D tensor with unit column stride, any row stride) to consecutive rows at the device address
``dst_addr`` (a peer's heap, as mapped here), and ``copy_word(dst_addr, src_addr)`` four bytes,
both on the side stream and in the order called. ``fork()`` makes the side stream wait for what the
current stream has queued, ``join()`` the current stream for what the side stream has: between
them the copies run beside the current stream's kernels, and all of it is captured into CUDA graphs
like any two-stream work. No allocation, no host synchronisation.

**Ordering contract.** A copy queued after another on the side stream starts after it has
completed, so a word copied last (a flag) reaches a peer after the rows before it: a peer that sees
the word (acquire) reads the rows. Nothing orders the copies with a kernel on the current stream
that runs between ``fork`` and ``join``: such a kernel must wait for the flag, and must leave SM room
for nothing on the side stream (the copies take none). In the CPU world the copies are plain
memory copies made at once (there is no stream), which keeps the same order.
"""

from __future__ import annotations

import torch

from ..errors import TritonCommError
from .communicator import Communicator
from .cuda_ipc import cuda_check

__all__ = ["CopyEngine"]


class CopyEngine:
    """See the module docstring. Set-up time: ``CopyEngine(comm)``; launch path: the rest."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.cuda = comm.backend == "cuda"
        self.stream = torch.cuda.Stream(comm.device) if self.cuda else None
        if self.cuda:
            from cuda.bindings import runtime

            self._rt = runtime
            self._kind = runtime.cudaMemcpyKind.cudaMemcpyDefault
        mem = comm.heap.memory
        #: (first address, bytes) of every rank's heap as mapped here: CPU-world copies go through views
        self._heaps = [(mem.peer_addrs[r], comm.heap.nbytes) for r in range(comm.world)]

    def fork(self) -> None:
        """The side stream waits for the work queued so far on the current stream."""
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.comm.device))

    def join(self) -> None:
        """The current stream waits for the copies queued so far on the side stream."""
        if self.cuda:
            torch.cuda.current_stream(self.comm.device).wait_stream(self.stream)

    def copy_rows(self, dst_addr: int, src: torch.Tensor) -> None:
        """``src`` (2-D, unit column stride) to ``src.shape[0]`` consecutive rows at ``dst_addr``."""
        rows, width = src.shape[0], src.shape[1] * src.element_size()
        if rows == 0:
            return
        if self.cuda:
            cuda_check(self._rt.cudaMemcpy2DAsync(dst_addr, width, src.data_ptr(), src.stride(0) * src.element_size(),
                                                  width, rows, self._kind, self.stream.cuda_stream),
                       "cudaMemcpy2DAsync (copy engine)")
        else:
            self._view(dst_addr, rows * width).view(src.dtype).view(rows, src.shape[1]).copy_(src)

    def copy_word(self, dst_addr: int, src_addr: int) -> None:
        """Four bytes from ``src_addr`` to ``dst_addr`` (heap addresses as mapped here)."""
        if self.cuda:
            cuda_check(self._rt.cudaMemcpyAsync(dst_addr, src_addr, 4, self._kind, self.stream.cuda_stream),
                       "cudaMemcpyAsync (copy engine)")
        else:
            self._view(dst_addr, 4).copy_(self._view(src_addr, 4))

    def _view(self, addr: int, nbytes: int) -> torch.Tensor:
        """CPU world: a byte view of ``nbytes`` at heap address ``addr``, in whichever rank's heap."""
        mem = self.comm.heap.memory
        for r, (base, size) in enumerate(self._heaps):
            if base <= addr and addr + nbytes <= base + size:
                return mem.view(addr - base, nbytes) if r == self.comm.rank else mem.peer_view(r, addr - base, nbytes)
        raise TritonCommError(f"copy engine: address {addr:#x} (+{nbytes}) lies in no heap")
