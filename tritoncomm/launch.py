"""Start N ranks on this machine: one process per GPU when GPUs are there, else the CPU world.

``LocalWorld`` keeps its ranks alive and runs functions in all of them (tests and the demo reuse
one world for many jobs); ``launch`` is the one-shot form. Each rank gets a ``RankContext`` with
torch.distributed initialised over loopback: NCCL plus a gloo CPU group on GPUs, gloo alone in the
CPU world, where ``TRITON_INTERPRET=1`` is set before the rank imports Triton.

``shared_gpus=True`` starts more GPU ranks than there are GPUs (rank ``r`` on GPU ``r % count``) for
correctness runs: the ranks' kernels are time-sliced, NCCL refuses ranks that share a GPU, so the
default group is gloo too, and ``CommConfig.shared_gpus`` is on in every rank. Never time it.

A job that raises on any rank raises ``RankError`` here with every failing rank's traceback; a
job that outlives its timeout kills the world and raises ``TimeoutError``. Nothing hangs.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import settings
from .config import SHARED_GPUS_ENV

__all__ = ["EXIT_S", "MULTICAST_OFF", "LocalWorld", "RankContext", "RankError", "detect_backend", "end_rank",
           "init_from_env", "join_ranks", "launch"]

#: NVLink multicast must stay off everywhere (it can take a shared host's GPUs out of service).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


#: How long a rank spawned on its own (``end_rank``, ``join_ranks``) may take to tear down and exit
#: after it has reported (seconds).
EXIT_S = 90.0


def end_rank() -> None:
    """The last step of a rank spawned with its own process group: destroy the group, and if the
    teardown or the interpreter's exit stalls, print every thread's stack and exit with code 1 after
    ``EXIT_S``, rather than hold the parent, which joins its non-daemon children when it exits."""
    import faulthandler

    import torch.distributed as dist

    faulthandler.dump_traceback_later(EXIT_S, exit=True)
    dist.destroy_process_group()


def join_ranks(procs: list[Any]) -> dict[int, int | None]:
    """Join ranks that have reported and then ``end_rank``; kill any still alive after ``EXIT_S`` plus
    a margin. Returns the exit codes of those that did not exit cleanly, by rank (empty: all did)."""
    deadline = time.monotonic() + EXIT_S + 30
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    return {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}


@dataclass
class RankContext:
    """What a job gets in each rank."""

    rank: int
    world: int
    backend: str  # "cuda" or "cpu"
    device: Any  # torch.device
    group: Any  # the default torch.distributed group (NCCL on GPUs, gloo on CPU and on shared GPUs)
    cpu_group: Any  # a gloo group over the same ranks
    shared_gpus: bool = False  # several ranks per GPU (time-sliced; correctness only)

    def barrier(self) -> None:
        """A host barrier over the ranks (the CPU group): what timing loops call between samples."""
        import torch.distributed as dist

        dist.barrier(group=self.cpu_group)


class RankError(RuntimeError):
    """One or more ranks raised; the message holds each failing rank's traceback."""

    def __init__(self, failures: dict[int, str]) -> None:
        self.failures = failures
        body = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        super().__init__(f"job failed on rank(s) {sorted(failures)}:\n{body}")


def detect_backend() -> str:
    """``"cuda"`` when this machine has at least one CUDA GPU, else ``"cpu"``."""
    if settings.triton_interprets():
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, backend: str, setup_timeout: float, conn: Any,
               shared_gpus: bool = False) -> None:
    import torch
    import torch.distributed as dist

    try:
        timeout = datetime.timedelta(seconds=setup_timeout)
        init = f"tcp://127.0.0.1:{port}"
        if backend == "cuda" and shared_gpus:
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
            cpu_group = dist.group.WORLD
        elif backend == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, timeout=timeout,
                                    device_id=device)
            cpu_group = dist.new_group(backend="gloo", timeout=timeout)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
            cpu_group = dist.group.WORLD
        ctx = RankContext(rank, world, backend, device, dist.group.WORLD, cpu_group, shared_gpus)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            conn.send(("ok", fn(ctx, *args, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()


class LocalWorld:
    """``world`` live ranks on this machine. Use as a context manager, or call ``close``.
    ``shared_gpus``: see the module docstring (GPU ranks only; ignored in the CPU world)."""

    def __init__(self, world: int, backend: str = "auto", *, setup_timeout: float = 120.0,
                 env: dict[str, str] | None = None, shared_gpus: bool = False) -> None:
        if world < 1:
            raise ValueError("world must be >= 1")
        self.world = world
        self.backend = detect_backend() if backend == "auto" else backend
        if self.backend not in ("cuda", "cpu"):
            raise ValueError(f"backend must be 'auto', 'cuda' or 'cpu', got {backend!r}")
        self.shared_gpus = shared_gpus and self.backend == "cuda"
        if self.backend == "cpu":
            from .kernels.interpreter import numpy_problem

            problem = numpy_problem()
            if problem:
                raise RuntimeError(problem)
        if self.backend == "cuda":
            import torch

            count = torch.cuda.device_count()
            if count < 1 or (count < world and not self.shared_gpus):
                raise RuntimeError(f"world {world} needs {world} GPUs, found {count} "
                                   "(shared_gpus=True runs several ranks per GPU, for correctness only)")
        ctx = mp.get_context("spawn")
        port = _free_port()
        extra = dict(MULTICAST_OFF)
        extra["TRITON_INTERPRET"] = "1" if self.backend == "cpu" else "0"
        extra[SHARED_GPUS_ENV] = "1" if self.shared_gpus else "0"
        extra.update(env or {})
        saved = {k: os.environ.get(k) for k in extra}  # restored below
        os.environ.update(extra)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for r in range(world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_rank_main, daemon=True, name=f"tritoncomm-rank{r}",
                                args=(r, world, port, self.backend, setup_timeout, child, self.shared_gpus))
                p.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._collect(setup_timeout + 30, "start-up")

    def _collect(self, timeout: float, what: str) -> list[Any]:
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        pending = set(range(self.world))
        while pending:
            for r in list(pending):
                conn, proc = self._conns[r], self._procs[r]
                if conn.poll(0.01):
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "error", f"rank {r} exited (code {proc.exitcode})"
                    pending.discard(r)
                    if status == "error":
                        failures[r] = value
                    else:
                        results[r] = value
                elif not proc.is_alive():
                    pending.discard(r)
                    failures[r] = f"rank {r} died (exit code {proc.exitcode})"
            if pending and time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{what}: rank(s) {sorted(pending)} did not finish within {timeout:.0f} s "
                                   f"(finished: {sorted(results)}, failed: {sorted(failures)}); world killed")
        if failures:
            if any("died" in v or "exited" in v for v in failures.values()):
                self.kill()
            raise RankError(failures)
        return [results[r] for r in range(self.world)]

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 600.0, **kwargs: Any) -> list[Any]:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results by rank."""
        if not self.alive:
            raise RuntimeError("this LocalWorld is closed or lost a rank")
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        return self._collect(timeout, getattr(fn, "__name__", "job"))

    def kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)

    def close(self) -> None:
        for conn, p in zip(self._conns, self._procs, strict=True):
            if p.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        for p in self._procs:
            p.join(30)
        self.kill()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> LocalWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def launch(fn: Callable[..., Any], world: int, *args: Any, backend: str = "auto", timeout: float = 600.0,
           shared_gpus: bool = False, **kwargs: Any) -> list[Any]:
    """Start ``world`` ranks, run ``fn(ctx, *args, **kwargs)`` in each, stop them; results by rank."""
    with LocalWorld(world, backend, shared_gpus=shared_gpus) as w:
        return w.run(fn, *args, timeout=timeout, **kwargs)


def init_from_env(backend: str = "auto", timeout_s: float = 600.0) -> RankContext:
    """Join a job started by torchrun, or by anything that sets ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` (optional) and ``MASTER_ADDR``/``MASTER_PORT``: initialise torch.distributed
    (NCCL plus a gloo CPU group on GPUs; gloo in the CPU world, which needs ``TRITON_INTERPRET=1``
    exported before Python starts) and return this rank's context."""
    import torch
    import torch.distributed as dist

    for k, v in MULTICAST_OFF.items():
        os.environ.setdefault(k, v)
    env = settings.torchrun_env()
    rank, world, local_rank = env.rank, env.world, env.local_rank
    backend = detect_backend() if backend == "auto" else backend
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if not dist.is_initialized():
            dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout, device_id=device)
        cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    else:
        device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        cpu_group = dist.group.WORLD
    return RankContext(rank, world, backend, device, dist.group.WORLD, cpu_group)
