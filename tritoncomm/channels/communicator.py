"""The communicator: one per process group. It owns the symmetric heap, the peer table, the
diagnostic record that bounded waits write, and the set-up channel to the other ranks.

Everything collective or allocating happens in the constructor (and in ``Channel``'s). Launching a
kernel afterwards needs only what ``kernel_args`` and a channel's offsets hand out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..config import CommConfig
from ..errors import (
    CommTimeoutError,
    InvalidInputError,
    SetupMismatchError,
    TritonCommError,
)
from ..kernels.backend import MAX_WORLD, interpreting
from ..kernels.consistency import (
    check_signatures,
    signature_table_bytes,
)
from ..kernels.diag import DIAG_WORDS, F
from ..kernels.interpreter import numpy_problem
from .bootstrap import Bootstrap, default_bootstrap
from .channel import Channel
from .cuda_ipc import HostMappedWords
from .diagnosis import recorded_error
from .heap import Region, SymmetricHeap
from .registered import RegisteredBuffers
from .topology import check_topology
from .watchdog import Watchdog

__all__ = ["Communicator", "resolve_backend"]


def resolve_backend(requested: str) -> str:
    """``"cuda"`` or ``"cpu"`` for this process (see ``CommConfig.backend``)."""
    interp = interpreting()
    if requested == "cpu" and not interp:
        raise TritonCommError("the CPU world runs kernels in Triton's interpreter: set TRITON_INTERPRET=1 before "
                              "triton is imported (tritoncomm's launcher does this)")
    if requested == "cuda" and interp:
        raise TritonCommError("backend 'cuda' requested but TRITON_INTERPRET=1 is set in this process")
    if interp and requested in ("cpu", "auto"):
        problem = numpy_problem()
        if problem:
            raise TritonCommError(problem)
    if requested == "auto":
        if interp:
            return "cpu"
        if torch.cuda.is_available():
            return "cuda"
        raise TritonCommError("no GPU here and TRITON_INTERPRET is not set: start the CPU world through "
                              "tritoncomm's launcher or set TRITON_INTERPRET=1 before importing triton")
    return requested


class Communicator:
    """Symmetric memory and signalling for the ranks of one group on one node.

    Args:
        group: the torch.distributed group to serve (default: the world). Used only to find a
            bootstrap when ``bootstrap`` is not given.
        config: ``CommConfig``; every rank must pass an equal one (checked).
        bootstrap: an explicit set-up channel (``GroupBootstrap`` / ``StoreBootstrap``).
        device: the CUDA device of this rank (default: the current one). Ignored on CPU.

    Construction is collective over the group, and so is ``close``.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, config: CommConfig | None = None,
                 bootstrap: Bootstrap | None = None, device: torch.device | int | None = None) -> None:
        self.config = config or CommConfig()
        self.bootstrap = bootstrap or default_bootstrap(group)
        self.rank = self.bootstrap.rank
        self.world = self.bootstrap.world
        self.backend = resolve_backend(self.config.backend)
        if self.backend == "cuda":
            index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index \
                if isinstance(device, int) else device.index
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
        self._closed = False
        self._user_regions: dict[int, Region] = {}
        self._broken: CommTimeoutError | None = None
        self._peers_gone = False

        seen = self.bootstrap.all_gather((self.world, self.backend, self.config))
        if any(s != seen[0] for s in seen):
            raise SetupMismatchError(f"ranks disagree on (world, backend, config): {seen}")
        if self.world > MAX_WORLD.value:
            raise TritonCommError(f"world size {self.world} exceeds the supported maximum {MAX_WORLD.value}")
        self.infos = check_topology(self.bootstrap, self.backend, self.device,
                                    shared_gpus=self.config.shared_gpus)

        nbytes = self.config.resolved_heap_bytes(self.backend)
        if self.backend == "cuda":
            from .cuda_ipc import CudaIpcPeerMemory

            memory = CudaIpcPeerMemory(nbytes, self.bootstrap, self.device)
        else:
            from .shm import ShmPeerMemory

            memory = ShmPeerMemory(nbytes, self.bootstrap)
        self.heap = SymmetricHeap(memory, self.device, self.bootstrap)
        self.diag = HostMappedWords(DIAG_WORDS, cuda=self.backend == "cuda")
        self.registered = RegisteredBuffers(self.heap, self.bootstrap, self.device, self.backend,
                                            self.config.registered_slots)
        #: Wait bound in kernel units (nanoseconds of wall-clock time in both worlds); 0 = unbounded.
        self.timeout = self.config.timeout_units(self.backend)
        #: Looks for a recorded failure every ``config.watchdog_s`` seconds (``channels.watchdog``), or None.
        self.watchdog = Watchdog(self.recorded_failure, self.config.watchdog_s, self.config.abort_on_timeout,
                                 f"tritoncomm-watchdog-r{self.rank}") if self.config.watchdog_s > 0 else None
        self._debug_channel = None
        if self.config.debug:
            self._debug_channel = Channel(self, "debug", programs=1, barrier_slots=1,
                                          buffer_bytes=signature_table_bytes())
        self.bootstrap.barrier()

    def require_open(self, what: str) -> None:
        """Raise ``TritonCommError`` naming ``what`` once this communicator is closed (its heap is gone)."""
        if self._closed:
            raise TritonCommError(f"{what}: the communicator is closed")

    # -- what kernels take -------------------------------------------------------------------
    def kernel_args(self) -> tuple[torch.Tensor, int, int, int, int]:
        """``(bases, rank, world, timeout, diag_addr)``: the arguments every kernel built on the
        primitives takes (see ``kernels``)."""
        return self.heap.bases, self.rank, self.world, self.timeout, self.diag.device_addr

    # -- symmetric tensors -------------------------------------------------------------------
    def empty(self, shape: int | tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """A tensor in this rank's symmetric heap, at the same offset on every rank.

        Collective, at set-up time: every rank calls it with the same shape and dtype, in the same
        order (checked). A producer kernel can write straight into it, and the collectives then use
        it in place instead of staging a copy (``AllReduce``: the two-shot writes peers' outputs
        directly; a symmetric input is pushed like a regular one, which measured faster than
        reading peers' inputs). Pass the *same* symmetric tensor on every rank to a
        collective (debug mode checks the offsets). The memory stays allocated until ``free``
        (collective) or ``close``.

        Ordering: what a kernel writes into the tensor is visible to peers' kernels only through a
        synchronisation of the primitives (the collectives' first barrier publishes every rank's
        input, prior kernels on its stream included); plain torch ops give peers no guarantee.
        """
        self.require_open("Communicator.empty")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = max(1, numel) * dtype.itemsize
        region = self.heap.alloc(nbytes, f"user.empty{shape}.{dtype}")
        self.heap.verify()
        t = self.heap.view(region)[:nbytes].view(dtype)[:numel].view(shape)
        self._user_regions[t.data_ptr()] = region
        return t

    def free(self, t: torch.Tensor) -> None:
        """Collective: return a tensor from ``empty`` to the heap (no kernel may still use it)."""
        region = self._user_regions.pop(t.data_ptr(), None)
        if region is None:
            raise InvalidInputError("free: the tensor was not made by this communicator's empty()")
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        self.bootstrap.barrier()
        self.heap.free(region)

    def heap_offset(self, t: torch.Tensor) -> int | None:
        """Byte offset of ``t``'s data in this rank's heap if all of it lies there, else None."""
        base = self.heap.memory.peer_addrs[self.rank]
        start = t.data_ptr() - base
        end = start + t.numel() * t.element_size()
        return start if 0 <= start and end <= self.heap.nbytes and t.is_contiguous() else None

    # -- registered buffers (regular tensors that peers store into) ---------------------------
    def register(self, *tensors: torch.Tensor) -> None:
        """Collective, at set-up time: map these regular tensors into every peer, so that a
        collective given one as its output writes peers' parts straight into it (the two-shot
        all-reduce and the direct all-gather then skip their copy out of the heap).

        Every rank registers as many tensors, in corresponding order, and later passes the
        corresponding tensors to the same calls (debug mode checks the slot). Each tensor must stay
        allocated while it may be used. See ``channels.registered`` for which memory qualifies.
        Ordering: registering publishes addresses only; what peers store into the tensor is
        visible after the collective that stores it returns on this rank's stream.
        """
        self.require_open("Communicator.register")
        self.registered.register(list(tensors))

    def peer_row(self, t: torch.Tensor) -> int | None:
        """Launch path (host-only): the device address of the table row that lists every rank's
        tensor corresponding to ``t`` (``world`` int64 addresses), or None. A tensor registered with
        ``register`` has one; inside ``graph_capture``, a tensor met while the stream captures
        takes a fresh row, written when the context exits."""
        if not t.is_contiguous():
            return None
        reg = self.registered
        slot = reg.slot_of(t.data_ptr())
        if slot is None and reg.deferring and torch.cuda.is_current_stream_capturing():
            slot = reg.reserve(t.data_ptr())
        return None if slot is None else reg.row_addr(slot)

    def peer_slot(self, row: int) -> int:
        """The slot number of a row address from ``peer_row`` (debug-mode signatures)."""
        return (row - self.registered.table.data_ptr()) // (8 * self.world)

    @contextmanager
    def graph_capture(self) -> Iterator[None]:
        """Capture CUDA graphs inside this context to have the collectives write peers' regular
        outputs directly (what vLLM's custom all-reduce does with its graph buffers).

        While a stream captures, each two-shot all-reduce and each direct all-gather with a regular
        output takes a fresh row of the registered-buffer table; on exit, collectively, every rank
        maps the captured outputs' allocations into every peer and writes the rows, so replays of
        graphs captured inside run with them. Every rank must capture the same sequence of collectives (checked
        by count). Replay only after the context has exited. Kernels launched outside capture are
        unaffected. If the body raises, the reserved rows are dropped unwritten and the graphs
        captured inside must not be replayed.
        """
        if self.backend != "cuda":
            raise TritonCommError("graph_capture: CUDA graphs exist in the GPU world only")
        reg = self.registered
        if reg.deferring:
            raise TritonCommError("graph_capture: already inside graph_capture")
        reg.deferring = True
        try:
            yield
        except BaseException:
            reg.deferring = False
            reg.discard()
            raise
        reg.deferring = False
        reg.commit()

    # -- debug mode --------------------------------------------------------------------------
    @property
    def debug(self) -> bool:
        return self._debug_channel is not None

    def debug_check(self, op: int, dtype: int, count: int, algo: int) -> None:
        """Debug mode: compare this call's signature with every rank's (see ``kernels.consistency``);
        raise ``CollectiveMismatchError`` on every rank if they differ. Outside CUDA-graph capture
        this synchronises the stream; under capture the mismatch surfaces at the next ``check``."""
        ch = self._debug_channel
        check_signatures[(1,)](op, dtype, count, algo, self.heap.bases, self.rank, self.world, self.timeout,
                               self.diag.device_addr, ch.flags_off, ch.epochs_off, ch.buffer_off)
        if self.backend == "cuda":
            if torch.cuda.is_current_stream_capturing():
                return
            torch.cuda.current_stream(self.device).synchronize()
        self.check()

    # -- health ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``CommTimeoutError`` if a kernel of this communicator gave up waiting, and
        ``CollectiveMismatchError`` if a barrier found ranks calling different collectives.

        Reads host-visible memory only: no synchronisation, safe on the launch path. A kernel
        that is still running is not yet reflected; ``synchronize`` waits for it first.
        """
        if self._closed:
            raise TritonCommError("communicator is closed")
        if self._broken is not None:
            raise self._broken
        if self.diag.word(F.STATUS) == 0:
            return
        words = self.diag.read()
        err = recorded_error(words, self.config.timeout_s, self.heap)
        if err is None:
            return
        if words[F.STATUS] == 3:  # debug mode's check: nothing ran, epochs agree; clear and stay usable
            self.diag.clear()
            raise err
        self._broken = err
        raise err

    def recorded_failure(self) -> str | None:
        """The failure (a timeout, or a barrier's mismatch) a kernel of this communicator has recorded,
        as its error's message, or None.
        Reads host-visible memory only; changes nothing (the watchdog calls it from its thread)."""
        if self._closed or self.diag.word(F.STATUS) == 0:
            return None
        words = self.diag.read()
        if words[F.STATUS] == 3:  # debug mode's check, raised at the call
            return None
        err = recorded_error(words, self.config.timeout_s, self.heap)
        return None if err is None else str(err)

    def synchronize(self) -> None:
        """Wait for this rank's device work, then ``check``."""
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        self.check()

    # -- lifetime ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once ``close`` has run: the heap is gone."""
        return self._closed

    @property
    def broken(self) -> bool:
        """True once a wait has expired (a peer may be dead): ``close`` then releases this rank's
        resources without waiting for the others."""
        return self._broken is not None

    #: How long ``close`` waits for the other ranks when this communicator is broken (seconds).
    BROKEN_CLOSE_WAIT_S = 5.0

    def close_barrier(self) -> None:
        """The barrier of the close path: every rank calls it, healthy or broken. A healthy rank
        waits up to the wait bound plus a minute; a broken one (a peer may be dead) at most
        ``BROKEN_CLOSE_WAIT_S`` and then goes on alone. Never hangs."""
        if self._broken is None:
            limit = (self.config.timeout_s or 600.0) + 60.0
            try:
                self.bootstrap.barrier(timeout=limit)
            except TimeoutError as e:  # a peer is dead or hung: release alone from now on
                missing = list(getattr(e, "missing", []))
                peer = next((r for r in missing if r != self.rank), -1)
                self._broken = CommTimeoutError(
                    f"tritoncomm close: rank {self.rank} waited {limit:g} s for rank(s) {missing or 'unknown'} at "
                    "the close barrier: they are dead or hung. This rank releases its memory without them.",
                    rank=self.rank, peer=peer, slot=-1, expected=0, seen=0, kind="close barrier", program=-1)
                self._peers_gone = True
                raise self._broken from e
            return
        if self._peers_gone:
            return
        try:
            self.bootstrap.barrier(timeout=self.BROKEN_CLOSE_WAIT_S)
        except Exception:
            self._peers_gone = True  # a peer is dead: later close steps go on alone at once

    def close(self) -> None:
        """Release the heap (unmap peers, free, unlink) and the diagnostic record. Collective, with
        a bounded wait: a broken communicator (a peer dead or hung) releases its own resources
        after ``BROKEN_CLOSE_WAIT_S`` even if the others never arrive."""
        if self._closed:
            return
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._broken is None:
            try:
                self.check()
            except CommTimeoutError:
                pass
        if self.backend == "cuda" and self._broken is None:
            torch.cuda.synchronize(self.device)
        if self._debug_channel is not None:
            self._debug_channel.close()
        self._closed = True
        self.registered.close()
        try:
            self.heap.close(barrier=self.close_barrier)
        except CommTimeoutError:
            self.heap.close(barrier=lambda: None)  # the peers are gone: unmap and release alone
            self.diag.close()
            raise
        self.diag.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world={self.world}, backend={self.backend}, "
                f"device={self.device}, heap={self.heap.nbytes >> 20} MiB)")
