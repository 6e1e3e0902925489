"""The watchdog: notices a kernel's recorded failure (a timeout, or a barrier's mismatch) within seconds,
CUDA-graph replays included.

A daemon thread per communicator reads the diagnostic record's status word every
``CommConfig.watchdog_s`` seconds: host-visible memory, so it synchronises nothing and adds nothing to
the launch path. The first time it finds a failure recorded it logs it (rank, peer, slot, what was
awaited) and stops; the communicator's next call raises it (``Communicator.check``). With
``CommConfig.abort_on_timeout`` (default: ``TRITONCOMM_ABORT_ON_TIMEOUT=1`` in the environment) it then
ends the process (``os.abort``), as ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` does for NCCL: a hung job
becomes a failed one that its launcher can restart.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

__all__ = ["Watchdog"]

log = logging.getLogger("tritoncomm")


class Watchdog:
    """Calls ``recorded()`` every ``period_s`` seconds until it returns a description (then logs it,
    keeps it in ``fired`` and, with ``abort``, ends the process) or ``stop`` is called."""

    def __init__(self, recorded: Callable[[], str | None], period_s: float, abort: bool, name: str) -> None:
        self._recorded, self.period_s, self.abort = recorded, period_s, abort
        #: What the watchdog found, or None.
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            what = self._recorded()
            if what:
                self.fired = what
                log.error("tritoncomm watchdog: %s", what)
                if self.abort:
                    log.error("tritoncomm watchdog: ending the process (abort_on_timeout)")
                    for handler in logging.getLogger().handlers + log.handlers:
                        handler.flush()
                    os.abort()
                return

    def stop(self) -> None:
        """Stop watching (idempotent); returns within one period."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.period_s + 1.0)
