"""Shared fixtures: live worlds of ranks reused across tests.

``TRITONCOMM_TEST_BACKEND`` picks the world: ``cpu`` (default; the CPU world, as in CI) or ``cuda``
(one process per GPU; run on a GPU machine). Tests marked ``gpu`` only run with ``cuda``.
``TRITONCOMM_TEST_WORLDS`` (e.g. ``8``) runs the world-parametrized tests at those sizes only and
skips every test that asks for another size (``helpers.world_sizes``).
"""

from __future__ import annotations

import os

import pytest

from tritoncomm.launch import LocalWorld

from .helpers import only_worlds

BACKEND = os.environ.get("TRITONCOMM_TEST_BACKEND", "cpu")
ONLY_WORLDS = only_worlds()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs TRITONCOMM_TEST_BACKEND=cuda (GPUs)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if BACKEND != "cuda":
        skip = pytest.mark.skip(reason="GPU test: set TRITONCOMM_TEST_BACKEND=cuda on a GPU machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


class Worlds:
    """Creates worlds on demand, keeps them, replaces any that lost a rank."""

    def __init__(self) -> None:
        self._worlds: dict[int, LocalWorld] = {}

    def __call__(self, n: int) -> LocalWorld:
        if ONLY_WORLDS and n not in ONLY_WORLDS:
            pytest.skip(f"world {n} not in TRITONCOMM_TEST_WORLDS")
        if BACKEND == "cuda":
            import torch

            if torch.cuda.device_count() < n:
                pytest.skip(f"needs {n} GPUs")
        w = self._worlds.get(n)
        if w is None or not w.alive:
            if w is not None:
                w.close()
            w = LocalWorld(n, BACKEND, setup_timeout=120)
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
