"""What the engine tests share: a world of ranks with the engines' own code on their path, and
checks that run inside ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tritoncomm.launch import LocalWorld

from ..conftest import BACKEND
from . import engines

#: The CPU world runs the engines as their CPU builds would (no CUDA), with tritoncomm turned on.
#: The engines on a machine with no GPU. A CUDA build of torch brings NCCL's library, which vLLM's PyNccl would load
#: and fail to start without a driver: vLLM's own switch keeps it off, as a missing library does with a CPU torch.
ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRITONCOMM_ENABLE": "1", "VLLM_DISABLE_PYNCCL": "1"}


def engine_paths() -> list[str]:
    """The engines' folders (fetched on first use); skips GPU runs, where their CPU path does not apply."""
    if BACKEND == "cuda":
        pytest.skip("the engine tests drive the engines' code in the CPU world")
    return engines.fetch()


@contextmanager
def engine_world(world: int, env: dict[str, str] | None = None) -> Iterator[LocalWorld]:
    """A world whose ranks import the engines (their folders go on the spawned ranks' path only), with
    ``env`` on top of ``ENGINE_ENV``."""
    paths = engine_paths()
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        w = LocalWorld(world, "cpu", env={**ENGINE_ENV, **(env or {})}, setup_timeout=120)
    finally:
        sys.path[:] = saved
    try:
        yield w
    finally:
        w.close()


def module_world(up: Callable[..., None], name: str, env: dict[str, str] | None = None) -> Any:
    """A module-scoped fixture ``name``: a two-rank ``engine_world`` (with ``env``) on which ``up`` has run."""

    @pytest.fixture(scope="module", name=name)
    def fixture() -> Iterator[LocalWorld]:
        with engine_world(2, env) as w:
            w.run(up)
            yield w

    return fixture


class PythonRun:
    """``code`` running in a fresh interpreter with the engines on its path, under ``env`` on top of
    this process's (``""`` unsets a variable)."""

    def __init__(self, code: str, env: dict[str, str]) -> None:
        paths = engine_paths()
        full = {**os.environ, **ENGINE_ENV, **env, "PYTHONPATH": os.pathsep.join([*paths, os.getcwd()])}
        for k in [k for k, v in env.items() if v == ""]:
            full.pop(k)
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=full)

    def output(self, timeout: float = 600) -> str:
        """Wait for the run; its stdout + stderr. Fails the test where it failed."""
        try:
            out, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        assert self._proc.returncode == 0, (out + err)[-4000:]
        return out + err

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def started_runs(code: str, cases: dict[str, dict[str, str]], test: str, name: str) -> Any:
    """A module-scoped fixture ``name``: ``code`` started at once in one interpreter per case of
    ``cases`` (id -> environment) that the session selected for the test function ``test``
    (parametrized by those ids), so that the engines' imports, which use one core each, overlap.
    Gives id -> ``PythonRun``; runs still going at the module's end are killed."""

    @pytest.fixture(scope="module", name=name)
    def fixture(request: pytest.FixtureRequest) -> Iterator[dict[str, PythonRun]]:
        wanted = {item.callspec.id for item in request.session.items
                  if getattr(item, "originalname", "") == test and hasattr(item, "callspec")}
        runs = {case: PythonRun(code, env) for case, env in cases.items() if case in wanted}
        try:
            yield runs
        finally:
            for run in runs.values():
                run.kill()

    return fixture


def gathered(ctx, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (gloo, CPU group), in rank order."""
    out = [torch.empty_like(t) for _ in range(ctx.world)]
    dist.all_gather(out, t.contiguous(), group=ctx.cpu_group)
    return out


def rank_order_sum(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The sum in rank order in fp32, rounded once: what tritoncomm's all-reduces compute."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(dtype)


def host(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the host, after the work that makes it (a CUDA tensor's device synchronised)."""
    if t.is_cuda:
        torch.cuda.synchronize(t.device)
    return t.cpu()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest error of ``a`` relative to ``b`` (magnitudes under 2^-6 count as 2^-6)."""
    return ((a.float() - b.float()).abs() / b.float().abs().clamp_min(2 ** -6)).max().item()


class Spy:
    """Counts the calls of one method of an object (and still calls it)."""

    def __init__(self, obj: object, name: str) -> None:
        self.calls, self.obj, self.name = 0, obj, name
        self.original = getattr(obj, name)

        def spy(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(obj, name, spy)

    def close(self) -> None:
        delattr(self.obj, self.name)
