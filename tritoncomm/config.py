"""Validated configuration of a communicator."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import settings

__all__ = ["BACKEND", "SHARED_GPUS_ENV", "CommConfig"]

_BACKENDS = ("auto", "cuda", "cpu")

#: Environment switch for ``CommConfig.shared_gpus`` (what ``LocalWorld(..., shared_gpus=True)`` sets
#: in its ranks, so that every communicator they build, the engines' and the backend's included, agrees).
SHARED_GPUS_ENV = settings.SHARED_GPUS.name
#: The name torch.distributed knows tritoncomm's backend by (``init_process_group("cpu:gloo,cuda:tritoncomm")``).
BACKEND = "tritoncomm"


def _shared_gpus_default() -> bool:
    return bool(settings.SHARED_GPUS.get())


@dataclass(frozen=True)
class CommConfig:
    """Settings fixed at communicator construction. Every rank must pass equal values (checked).

    Attributes:
        backend: ``"cuda"`` (CUDA IPC heaps, compiled kernels), ``"cpu"`` (POSIX shared memory,
            kernels under ``TRITON_INTERPRET=1``) or ``"auto"`` (CUDA when this process compiles
            kernels and has a GPU, else CPU).
        heap_bytes: size of each rank's symmetric heap. ``None`` picks 512 MiB on CUDA and
            32 MiB in the CPU world.
        timeout_s: bound on every wait inside a kernel; ``0`` disables the bound.
        watchdog_s: how often the watchdog looks for a timeout recorded by a kernel (``channels.watchdog``:
            it logs it within that long, graph replays included); ``0`` disables the watchdog.
        abort_on_timeout: the watchdog ends the process once it has logged a timeout (default:
            ``TRITONCOMM_ABORT_ON_TIMEOUT=1`` in the environment), as ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` does.
        check_calls: the collectives' barriers compare every call's signature (op, dtype, element count,
            algorithm) and a mismatch raises ``CollectiveMismatchError`` on every rank with no output
            written (``kernels.barrier``; default: on unless ``TRITONCOMM_CHECK_CALLS=0``). Off compiles
            the kernels without the check; for measuring its cost.
        debug: before every collective, the ranks compare (op, dtype, element count, algorithm)
            through the heap and raise ``CollectiveMismatchError`` on every rank if they differ
            (one small kernel and, outside graph capture, one stream synchronisation per call).
        registered_slots: rows of the registered-buffer table (``Communicator.register``,
            ``Communicator.graph_capture``): one per registered tensor or captured call that
            writes peers' regular outputs.
        shared_gpus: let several ranks of one host use the same GPU (default: ``TRITONCOMM_SHARED_GPUS=1``
            in the environment). Their kernels are time-sliced, so every wait for a peer lasts up to a
            scheduler time slice: a correctness harness for machines with fewer GPUs than ranks, never
            a way to run fast. Without it, ranks sharing a GPU are refused at set-up.
    """

    backend: str = "auto"
    heap_bytes: int | None = None
    timeout_s: float = 60.0
    watchdog_s: float = 2.0
    abort_on_timeout: bool = field(default_factory=lambda: bool(settings.ABORT_ON_TIMEOUT.get()))
    check_calls: bool = field(default_factory=lambda: bool(settings.CHECK_CALLS.get()))
    debug: bool = False
    registered_slots: int = 16384
    shared_gpus: bool = field(default_factory=_shared_gpus_default)

    def __post_init__(self) -> None:
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {self.backend!r}")
        if self.heap_bytes is not None and (not isinstance(self.heap_bytes, int) or self.heap_bytes < 1 << 20):
            raise ValueError(f"heap_bytes must be an int of at least 1 MiB, got {self.heap_bytes!r}")
        if not (self.timeout_s >= 0):
            raise ValueError(f"timeout_s must be >= 0, got {self.timeout_s!r}")
        if not (self.watchdog_s >= 0):
            raise ValueError(f"watchdog_s must be >= 0, got {self.watchdog_s!r}")
        if not isinstance(self.registered_slots, int) or self.registered_slots < 1:
            raise ValueError(f"registered_slots must be a positive int, got {self.registered_slots!r}")

    def resolved_heap_bytes(self, backend: str) -> int:
        """Heap size to allocate for a resolved backend."""
        if self.heap_bytes is not None:
            return self.heap_bytes
        return (512 << 20) if backend == "cuda" else (32 << 20)

    def timeout_units(self, backend: str) -> int:
        """The wait bound in the kernels' unit, nanoseconds of wall-clock time in both worlds
        (``backend`` is kept for callers; 0: unbounded)."""
        if self.timeout_s == 0:
            return 0
        return max(1, int(self.timeout_s * 1e9))
