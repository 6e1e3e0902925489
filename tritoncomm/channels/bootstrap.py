"""Out-of-band exchange between the ranks of a group during set-up (never on the launch path).

Two implementations of one small interface:

* ``GroupBootstrap``: over a torch.distributed CPU (gloo) process group.
* ``StoreBootstrap``: over a torch.distributed ``Store`` (for example the TCP store a launcher
  created), so it can run beside an existing NCCL group without creating a new group.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any, Protocol

import torch.distributed as dist

__all__ = ["Bootstrap", "GroupBootstrap", "StoreBootstrap", "default_bootstrap"]


class Bootstrap(Protocol):
    """What set-up needs from the ranks' control channel."""

    rank: int
    world: int

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank (picklable objects)."""

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has called it; with ``timeout`` (seconds), raise if that takes
        longer. Ranks must agree on whether they pass a timeout (it selects the protocol)."""


class GroupBootstrap:
    """Bootstrap over a CPU process group (gloo)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self, timeout: float | None = None) -> None:
        if timeout is None:
            self.all_gather(None)
        else:
            dist.monitored_barrier(self.group, timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True)


class StoreBootstrap:
    """Bootstrap over a key-value store shared by the ranks.

    Keys are ``{prefix}/{round}/{rank}``; ``prefix`` must be unique per group (two groups that use
    one store need two prefixes).
    """

    def __init__(self, store: dist.Store, rank: int, world: int, prefix: str = "tritoncomm") -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.prefix = prefix
        self._round = 0

    def all_gather(self, obj: Any, timeout: float | None = None) -> list[Any]:
        r = self._round
        self._round += 1
        self.store.set(f"{self.prefix}/{r}/{self.rank}", pickle.dumps(obj))
        keys = [f"{self.prefix}/{r}/{i}" for i in range(self.world)]
        if timeout is None:
            self.store.wait(keys)
        else:
            self.store.wait(keys, datetime.timedelta(seconds=timeout))
        return [pickle.loads(self.store.get(k)) for k in keys]

    def barrier(self, timeout: float | None = None) -> None:
        self.all_gather(None, timeout)


def default_bootstrap(group: dist.ProcessGroup | None = None) -> Bootstrap:
    """A bootstrap for ``group`` (default: the world). Uses the group itself when it is gloo;
    otherwise creates a gloo group over the same ranks, which is collective over *all* ranks of
    the default group (call it on every rank, in the same order, as for ``dist.new_group``)."""
    if dist.get_backend(group) == "gloo":
        return GroupBootstrap(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    return GroupBootstrap(dist.new_group(ranks=ranks, backend="gloo"))
