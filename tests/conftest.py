"""Shared fixtures: live worlds of ranks reused across tests.

``TRITONCOMM_TEST_BACKEND`` picks the world: ``cpu`` (default; the CPU world, as in CI) or ``cuda``
(one process per GPU; run on a GPU machine). Tests marked ``gpu`` only run with ``cuda``.
``TRITONCOMM_TEST_WORLDS`` (e.g. ``8``) runs the world-parametrized tests at those sizes only and
skips every test that asks for another size (``helpers.world_sizes``).
``TRITONCOMM_TEST_SHARED_GPUS=1`` (with ``cuda``) runs worlds larger than the GPU count with several
ranks per GPU (``LocalWorld(shared_gpus=True)``: time-sliced, correctness only); tests marked ``nccl``
(NCCL between the ranks, which refuses ranks that share a GPU) skip there.
"""

from __future__ import annotations

import os

import pytest

from tritoncomm.launch import LocalWorld, RankError

from .helpers import only_worlds

BACKEND = os.environ.get("TRITONCOMM_TEST_BACKEND", "cpu")
ONLY_WORLDS = only_worlds()
SHARED_GPUS = BACKEND == "cuda" and os.environ.get("TRITONCOMM_TEST_SHARED_GPUS", "0") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs TRITONCOMM_TEST_BACKEND=cuda (GPUs)")
    config.addinivalue_line("markers", "nccl: needs NCCL between the ranks (skipped on shared GPUs)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = pytest.mark.skip(reason="GPU test: set TRITONCOMM_TEST_BACKEND=cuda on a GPU machine")
    nccl = pytest.mark.skip(reason="NCCL refuses ranks that share a GPU")
    for item in items:
        if BACKEND != "cuda" and "gpu" in item.keywords:
            item.add_marker(gpu)
        if SHARED_GPUS and "nccl" in item.keywords:
            item.add_marker(nccl)


def new_world(n: int, **kwargs) -> LocalWorld:
    """A world of ``n`` ranks on this run's backend (``TRITONCOMM_TEST_BACKEND``); skips the test when
    the machine has fewer GPUs than ranks, unless ``TRITONCOMM_TEST_SHARED_GPUS=1``."""
    if BACKEND == "cuda":
        import torch

        if torch.cuda.device_count() < n and not SHARED_GPUS:
            pytest.skip(f"needs {n} GPUs (TRITONCOMM_TEST_SHARED_GPUS=1 shares them)")
    kwargs.setdefault("setup_timeout", 120)
    return LocalWorld(n, BACKEND, shared_gpus=SHARED_GPUS, **kwargs)


def _meets(ctx) -> bool:
    """A job: one gloo collective over the world's CPU group."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1), group=ctx.cpu_group)
    return True


class CheckedWorld:
    """A live world whose ``run``, when a job fails, checks that the ranks can still meet: a job that
    raised on some ranks inside a collective leaves the others' gloo group broken, and every later
    job on that world would fail with it. A world that cannot meet is killed, so that the next test
    gets a fresh one; the failure itself is raised as it was."""

    def __init__(self, world: LocalWorld) -> None:
        self._inner = world

    def __getattr__(self, name: str):  # everything else is the LocalWorld's (world, backend, alive, close)
        return getattr(self._inner, name)

    def run(self, fn, *args, **kwargs):
        try:
            return self._inner.run(fn, *args, **kwargs)
        except RankError:
            if self._inner.alive:
                try:
                    self._inner.run(_meets, timeout=60)
                except (RankError, TimeoutError):
                    self._inner.kill()
            raise


class Worlds:
    """Creates worlds on demand, keeps them, replaces any that lost a rank or cannot meet."""

    def __init__(self) -> None:
        self._worlds: dict[int, CheckedWorld] = {}

    def __call__(self, n: int) -> CheckedWorld:
        if ONLY_WORLDS and n not in ONLY_WORLDS:
            pytest.skip(f"world {n} not in TRITONCOMM_TEST_WORLDS")
        w = self._worlds.get(n)
        if w is None or not w.alive:
            if w is not None:
                w.close()
            w = CheckedWorld(new_world(n))
            self._worlds[n] = w
        return w

    def close(self) -> None:
        for w in self._worlds.values():
            w.close()
        self._worlds.clear()


@pytest.fixture(scope="session")
def worlds():
    w = Worlds()
    yield w
    w.close()
