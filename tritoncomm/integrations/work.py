"""The work object the ``tritoncomm`` torch.distributed backend (``integrations.backend``) returns for a
served collective, and the stream key it orders by."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["TritonCommWork", "current_stream_key"]


class TritonCommWork(dist.Work):
    """A served collective, already launched on the caller's stream (see the module docstring).

    ``stream`` is the launch stream of an ``async_op=True`` call, as the device's current stream
    ``(id, device index, device type)`` (``current_stream_key``; None: nothing to order). No event is
    recorded at the launch: ``wait()`` on the launch stream has nothing to do (stream order), and from
    another stream it records one on the launch stream then, which orders after the collective (and
    after whatever the launch stream took since; never a cycle, since a wait only refers to records
    made before it).

    A call whose kernel gave up waiting never reports success. ``failure`` returns the group's
    recorded timeout (read from host-visible memory, no synchronisation): ``wait()`` raises it once it
    is recorded (in the CPU world, where kernels run at the call, always; on GPUs if the kernel has
    already ended, else the next call raises it), and once the work has completed ``is_success()`` is
    False, ``exception()`` holds it and the future carries it."""

    def __init__(self, outputs: list[torch.Tensor], stream: tuple[int, int, int] | None = None,
                 failure: Callable[[], BaseException | None] | None = None) -> None:
        super().__init__()
        self._outputs, self._stream = outputs, stream
        self._event: torch.cuda.Event | None = None
        self._failure = failure if failure is not None else _no_failure

    def _recorded(self) -> torch.cuda.Event:
        if self._event is None:
            sid, index, kind = self._stream  # type: ignore[misc]
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.Stream(stream_id=sid, device_index=index, device_type=kind))
        return self._event

    def wait(self, timeout: timedelta | None = None) -> bool:
        s = self._stream
        if s is not None and current_stream_key(s[1]) != s:
            torch.cuda.current_stream(s[1]).wait_event(self._recorded())
        err = self._failure()
        if err is not None:
            raise err
        return True

    def is_completed(self) -> bool:
        return self._stream is None or self._recorded().query()

    def is_success(self) -> bool:
        return self.is_completed() and self._failure() is None

    def exception(self) -> BaseException | None:
        return self._failure()

    def synchronize(self) -> None:
        if self._stream is not None:
            self._recorded().synchronize()

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        err = self._failure()
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(self._outputs)
        return fut


def _no_failure() -> None:
    return None


def current_stream_key(device: int | None = None) -> tuple[int, int, int]:
    """The current CUDA stream of ``device`` (default: the current device) as ``(id, device index,
    device type)``: what ``torch.cuda.current_stream`` builds its object from, without building it
    (a few microseconds of host time a call)."""
    return torch._C._cuda_getCurrentStream(torch.cuda.current_device() if device is None else device)
