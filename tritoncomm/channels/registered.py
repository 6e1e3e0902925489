"""Registered buffers: regular tensors of every rank, mapped into every peer, by slot.

The symmetric heap serves tensors made by ``Communicator.empty``. An engine's tensors come from
PyTorch's caching allocator (under CUDA-graph capture, from the graph's memory pool). Registering
one maps the allocation that holds it into every peer (CUDA IPC of the allocation's base, opened
once per allocation and peer) and writes where each rank sees it into one row of a device table:
``table[slot, p]`` is the address, in this process, of rank ``p``'s tensor of that slot. A kernel
handed the row's address stores into every rank's tensor directly (``heap_ptr(row, p, 0, DTYPE)``).

Slots are numbered in registration order on every rank, so slot ``i`` names corresponding tensors
only if every rank registers in the same order and then passes those tensors to the same
collective calls. The collectives' outputs met under capture do: every rank captures the same
sequence of calls, and each call takes a fresh slot (slots are not shared by address, since two
calls that reuse one address on this rank may use two on a peer).

Two ways in, both collective and at set-up time (never on a launch path):

* ``register``: now, for tensors that live as long as their use (static buffers);
* ``reserve`` a slot during capture (the captured kernel holds the row's address), then ``commit``
  after it: the rows are written before any replay. ``Communicator.graph_capture`` does this.

Ordering: registration gives addresses, nothing else. What a kernel stores through a row becomes
visible to the owner only through the primitives' release/acquire (the collectives' barriers).

Which memory: in the GPU world any ``cudaMalloc`` memory (PyTorch's default allocator and graph
pools; not ``expandable_segments``, which has no legacy IPC handle) and heap tensors; in the CPU
world only heap tensors (another process's private memory cannot be mapped). A registered
tensor's allocation must stay allocated while any rank may launch with it (do not empty the
caching allocator's cache in between). Mappings are closed by ``close``.
"""

from __future__ import annotations

import torch

from ..errors import InvalidInputError, PeerAccessError, SetupMismatchError, TritonCommError
from .bootstrap import Bootstrap
from .heap import SymmetricHeap

__all__ = ["RegisteredBuffers"]


class RegisteredBuffers:
    """The slot table and the peer mappings behind it (one per communicator).

    Args:
        heap: the communicator's heap (heap tensors are registered by offset, without IPC).
        bootstrap: the set-up channel.
        device: where the table lives (the rank's GPU, or the CPU).
        backend: ``"cuda"`` or ``"cpu"``.
        slots: table rows (``CommConfig.registered_slots``; ``world`` x 8 bytes each).
    """

    def __init__(self, heap: SymmetricHeap, bootstrap: Bootstrap, device: torch.device, backend: str,
                 slots: int) -> None:
        self.heap = heap
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.world = bootstrap.world
        self.backend = backend
        self.slots = slots
        #: int64 [slots, world]; row ``i`` is handed to kernels by address (``row_addr``).
        self.table = torch.zeros(slots, self.world, dtype=torch.int64, device=device)
        self._next = 0
        self._by_ptr: dict[int, int] = {}  # eager registrations: data_ptr -> slot
        self._pending: list[tuple[int, int]] = []  # (slot, data_ptr) reserved under capture
        self._opened: dict[tuple[int, bytes], int] = {}  # (peer, IPC handle) -> mapped base
        self.deferring = False

    @property
    def used(self) -> int:
        """Slots taken so far (each registered or reserved buffer takes one, until ``close``)."""
        return self._next

    # -- launch path (host-only lookups) ---------------------------------------------------------
    def slot_of(self, ptr: int) -> int | None:
        """The slot of an eagerly registered tensor starting at ``ptr``, else None."""
        return self._by_ptr.get(ptr)

    def row_addr(self, slot: int) -> int:
        """Device address of row ``slot`` (``world`` int64 addresses)."""
        return self.table.data_ptr() + slot * self.world * 8

    def reserve(self, ptr: int) -> int | None:
        """Take the next slot for the tensor at ``ptr`` (under capture; filled by ``commit``), or
        None if ``ptr`` is not 16-byte aligned (the caller then takes its copying path)."""
        if ptr % 16:
            return None
        slot = self._take(1)
        self._pending.append((slot, ptr))
        return slot

    # -- set-up (collective) ---------------------------------------------------------------------
    def register(self, tensors: list[torch.Tensor]) -> list[int]:
        """Collective: give each tensor a slot and map it into every peer. Every rank passes as
        many tensors, in corresponding order."""
        for t in tensors:
            if not t.is_contiguous():
                raise InvalidInputError("register: tensors must be contiguous")
            if t.data_ptr() % 16:
                raise InvalidInputError(f"register: tensor data must be 16-byte aligned (address {t.data_ptr():#x})")
            if self.backend == "cuda" and t.device.type != "cuda":
                raise InvalidInputError(f"register: a {t.device} tensor in the GPU world")
        self._check_count(len(tensors), "register")
        first = self._take(len(tensors))
        entries = [(first + i, t.data_ptr()) for i, t in enumerate(tensors)]
        self._fill(entries)
        for slot, ptr in entries:
            self._by_ptr[ptr] = slot
        return [s for s, _ in entries]

    def commit(self) -> int:
        """Collective: map the tensors reserved since the last commit and write their rows.
        Returns how many."""
        entries, self._pending = self._pending, []
        self._check_count(len(entries), "graph_capture")
        self._fill(entries)
        return len(entries)

    def discard(self) -> None:
        """Forget reserved slots (a capture that failed); their rows stay unwritten."""
        self._pending = []

    def close(self) -> None:
        """Unmap peers' buffers (the caller has let this rank's kernels finish)."""
        if self.backend == "cuda" and self._opened:
            from cuda.bindings import runtime as rt

            for base in self._opened.values():
                rt.cudaIpcCloseMemHandle(base)
        self._opened = {}
        self._by_ptr = {}
        self._pending = []

    # -- internals --------------------------------------------------------------------------------
    def _take(self, n: int) -> int:
        if self._next + n > self.slots:
            raise InvalidInputError(f"registered buffers: {self._next} of {self.slots} slots used, {n} more asked; "
                                    "raise the communicator's registered_slots")
        first, self._next = self._next, self._next + n
        return first

    def _check_count(self, n: int, what: str) -> None:
        counts = self.bootstrap.all_gather(n)
        if any(c != counts[0] for c in counts):
            raise SetupMismatchError(f"{what}: ranks registered different numbers of buffers ({counts}); every rank "
                                     "must register (or capture) the same sequence")

    def _describe(self, ptr: int) -> tuple:
        """How peers find this rank's memory at ``ptr``: ("heap", offset) or ("ipc", handle, offset)."""
        base = self.heap.memory.peer_addrs[self.rank]
        if base <= ptr < base + self.heap.nbytes:
            return ("heap", ptr - base)
        if self.backend != "cuda":
            raise InvalidInputError("register: in the CPU world only tensors in the symmetric heap "
                                    "(Communicator.empty) can be registered")
        from cuda.bindings import driver

        from .cuda_ipc import driver_check, ipc_export

        alloc, _size = driver_check(driver.cuMemGetAddressRange(driver.CUdeviceptr(ptr)),
                                    f"cuMemGetAddressRange({ptr:#x})")
        raw = ipc_export(int(alloc), "cudaIpcGetMemHandle (is PYTORCH_CUDA_ALLOC_CONF=expandable_segments set? "
                                     "its memory cannot be registered)")
        return ("ipc", raw, ptr - int(alloc))

    def _peer_addr(self, peer: int, desc: tuple) -> int:
        if desc[0] == "heap":
            return self.heap.memory.peer_addrs[peer] + desc[1]
        _, raw, offset = desc
        key = (peer, raw)
        if key not in self._opened:
            from .cuda_ipc import ipc_open

            self._opened[key] = ipc_open(raw, f"cudaIpcOpenMemHandle(rank {peer})")
        return self._opened[key] + offset

    def _fill(self, entries: list[tuple[int, int]]) -> None:
        """Collective: exchange descriptors of ``entries`` ((slot, ptr) pairs), map, write rows."""
        error = None
        descs: list[tuple] = []
        try:
            descs = [self._describe(ptr) for _, ptr in entries]
        except TritonCommError as e:
            error = str(e)
        slots = [s for s, _ in entries]
        everyone = self.bootstrap.all_gather((error, slots, descs))
        errors = [e for e, _, _ in everyone]
        if any(errors):
            raise InvalidInputError("register failed: "
                                    + "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e))
        if any(s != slots for _, s, _ in everyone):
            raise SetupMismatchError(f"register: ranks hold different slots ({[s for _, s, _ in everyone]})")
        rows = [[0] * self.world for _ in entries]
        try:
            for p, (_, _, theirs) in enumerate(everyone):
                for i, desc in enumerate(theirs):
                    rows[i][p] = entries[i][1] if p == self.rank else self._peer_addr(p, desc)
        except TritonCommError as e:
            error = str(e)
        errors = self.bootstrap.all_gather(error)
        if any(errors):
            raise PeerAccessError("register: mapping a peer's buffer failed: "
                                  + "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e))
        if entries:
            idx = torch.tensor(slots, dtype=torch.int64, device=self.table.device)
            self.table.index_copy_(0, idx, torch.tensor(rows, dtype=torch.int64, device=self.table.device))
