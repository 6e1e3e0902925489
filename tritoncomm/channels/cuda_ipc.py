"""GPU world: each rank's heap is one ``cudaMalloc`` block exported with CUDA IPC.

Every rank allocates its heap, exports a legacy IPC handle, gathers everyone's handles over the
bootstrap and opens them with lazy peer access. The heap is allocated here, not taken from
PyTorch's caching allocator: IPC handles of ``expandable_segments`` memory do not work, and a heap
that we own can be freed exactly once, after every peer has closed its mapping.

All CUDA calls go through cuda-python (``cuda.bindings.runtime``). The only raw memory access is
copying the 64-byte handle structure to and from bytes for the exchange.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from ..errors import PeerAccessError, TritonCommError
from .bootstrap import Bootstrap

__all__ = ["CudaIpcPeerMemory", "HostMappedWords", "cuda_check", "driver_check", "ipc_export", "ipc_open", "runtime"]

_HANDLE_BYTES = 64


def runtime() -> Any:
    """cuda-python's CUDA runtime bindings (imported on first use: the CPU world has no cuda-python)."""
    from cuda.bindings import runtime as rt

    return rt


def cuda_check(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(err, *values)`` result, raising on error."""
    rt = runtime()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        raise TritonCommError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def driver_check(result: Any, what: str) -> Any:
    """``cuda_check`` for the driver API (``cuda.bindings.driver``)."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise TritonCommError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else tuple(values)


def ipc_export(ptr: int, what: str = "cudaIpcGetMemHandle") -> bytes:
    """The legacy IPC handle of the ``cudaMalloc`` allocation that starts at ``ptr``, as bytes."""
    handle = cuda_check(runtime().cudaIpcGetMemHandle(ptr), what)
    return ctypes.string_at(handle.getPtr(), _HANDLE_BYTES)


def ipc_open(raw: bytes, what: str) -> int:
    """Map a peer's allocation from its ``ipc_export`` bytes (lazy peer access); close it with
    ``cudaIpcCloseMemHandle``."""
    rt = runtime()
    handle = rt.cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), raw, _HANDLE_BYTES)
    return int(cuda_check(rt.cudaIpcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess), what))


class _CudaBytes:
    """Exposes raw device memory to ``torch.as_tensor`` (no ownership)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None,
        }


class CudaIpcPeerMemory:
    """``PeerMemory`` over CUDA IPC (collective construction and close)."""

    def __init__(self, nbytes: int, bootstrap: Bootstrap, device: torch.device) -> None:
        rt = runtime()
        self.nbytes = nbytes
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.device = device
        cuda_check(rt.cudaSetDevice(device.index), "cudaSetDevice")
        self._own = cuda_check(rt.cudaMalloc(nbytes), f"cudaMalloc({nbytes})")
        self._opened: list[int] = []
        try:
            cuda_check(rt.cudaMemset(self._own, 0, nbytes), "cudaMemset")
            cuda_check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            handles = bootstrap.all_gather(ipc_export(self._own))
            error = None
            addrs: list[int] = []
            for r, h in enumerate(handles):
                if r == self.rank:
                    addrs.append(int(self._own))
                    continue
                try:
                    ptr = ipc_open(h, f"cudaIpcOpenMemHandle(rank {r})")
                    self._opened.append(ptr)
                    addrs.append(ptr)
                except TritonCommError as e:
                    error = str(e)
                    break
            errors = bootstrap.all_gather(error)
            if any(errors):
                raise PeerAccessError(
                    "CUDA IPC mapping failed: " + "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e))
            self.peer_addrs = addrs
        except BaseException:
            self._release()
            raise

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        return torch.as_tensor(_CudaBytes(int(self._own) + offset, nbytes), device=self.device)

    def peer_view(self, peer: int, offset: int, nbytes: int) -> torch.Tensor:
        return torch.as_tensor(_CudaBytes(self.peer_addrs[peer] + offset, nbytes), device=self.device)

    def _release(self) -> None:
        rt = runtime()
        for ptr in self._opened:
            rt.cudaIpcCloseMemHandle(ptr)
        self._opened = []
        if self._own is not None:
            rt.cudaFree(self._own)
            self._own = None

    def close(self, barrier: Callable[[], None] | None = None) -> None:
        if self._own is None:
            return
        rt = runtime()
        rt.cudaDeviceSynchronize()
        for ptr in self._opened:
            rt.cudaIpcCloseMemHandle(ptr)
        self._opened = []
        (barrier or self.bootstrap.barrier)()  # every peer has unmapped our heap
        cuda_check(rt.cudaFree(self._own), "cudaFree")
        self._own = None
        self.peer_addrs = []


class HostMappedWords:
    """A few int64 words of pinned host memory that kernels can write and the host can read at any
    time without synchronising (on the GPU: ``cudaHostAlloc`` mapped; on the CPU: plain memory)."""

    def __init__(self, words: int, cuda: bool) -> None:
        self.words = words
        self._cuda = cuda
        if cuda:
            rt = runtime()
            flags = rt.cudaHostAllocMapped | rt.cudaHostAllocPortable
            self._host = int(cuda_check(rt.cudaHostAlloc(8 * words, flags), "cudaHostAlloc"))
            self.device_addr = int(cuda_check(rt.cudaHostGetDevicePointer(self._host, 0), "cudaHostGetDevicePointer"))
            self._array = (ctypes.c_int64 * words).from_address(self._host)
            ctypes.memset(self._host, 0, 8 * words)
        else:
            self._array = (ctypes.c_int64 * words)()
            self._host = ctypes.addressof(self._array)
            self.device_addr = self._host

    def read(self) -> list[int]:
        return list(self._array)

    def word(self, i: int) -> int:
        """Word ``i`` alone (the launch path's check reads one)."""
        return self._array[i]

    def clear(self) -> None:
        ctypes.memset(self._host, 0, 8 * self.words)

    def close(self) -> None:
        if self._cuda and self._host:
            self._array = None
            cuda_check(runtime().cudaFreeHost(self._host), "cudaFreeHost")
        self._host = 0
