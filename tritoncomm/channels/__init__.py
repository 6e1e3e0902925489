"""Host side: bootstrap, symmetric heaps (CUDA IPC or POSIX shared memory), communicators and
channels that hand kernels their peer-pointer and signal tables."""

from .bootstrap import Bootstrap, GroupBootstrap, StoreBootstrap, default_bootstrap
from .channel import Channel
from .communicator import Communicator, resolve_backend
from .heap import HEAP_ALIGN, HeapAllocator, Region, SymmetricHeap

__all__ = [
    "Bootstrap", "Channel", "Communicator", "GroupBootstrap", "HEAP_ALIGN", "HeapAllocator", "Region",
    "StoreBootstrap", "SymmetricHeap", "default_bootstrap", "resolve_backend",
]
