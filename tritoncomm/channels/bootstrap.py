"""Out-of-band exchange between the ranks of a group during set-up (never on the launch path).

Two implementations of one small interface:

* ``GroupBootstrap``: over a torch.distributed CPU (gloo) process group.
* ``StoreBootstrap``: over a torch.distributed ``Store`` (for example the TCP store a launcher
  created), so it can run beside an existing NCCL group without creating a new group.
"""

from __future__ import annotations

import datetime
import pickle
import uuid
from typing import Any, Protocol

import torch.distributed as dist

__all__ = ["BarrierTimeout", "Bootstrap", "GroupBootstrap", "StoreBootstrap", "default_bootstrap"]


class Bootstrap(Protocol):
    """What set-up needs from the ranks' control channel."""

    rank: int
    world: int

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank (picklable objects)."""

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has called it; with ``timeout`` (seconds), raise if that takes
        longer. Ranks must agree on whether they pass a timeout (it selects the protocol)."""


class BarrierTimeout(TimeoutError):
    """A timed barrier expired on ``rank``; ``missing``: the ranks that had not reached it."""

    def __init__(self, rank: int, world: int, missing: list[int], timeout: float) -> None:
        super().__init__(f"rank {rank}: {world - len(missing)} of {world} ranks reached the barrier within "
                         f"{timeout:g} s; rank(s) {missing} did not")
        self.rank, self.missing, self.timeout = rank, missing, timeout


class GroupBootstrap:
    """Bootstrap over a CPU process group (gloo).

    Untimed barriers are gloo collectives. Timed barriers go through the group's key-value store
    instead, so that every rank gives up at its own deadline: gloo's ``monitored_barrier`` makes
    the ranks other than 0 wait for rank 0's answer for the group's whole timeout (often many
    minutes) once rank 0 has given up. The store keys carry rank 0's token, agreed on the first
    ``all_gather``; the last rank to leave a timed barrier deletes them (a barrier that timed out
    leaves its keys). A timed barrier before any ``all_gather`` uses ``monitored_barrier``."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._token = uuid.uuid4().hex
        self._prefix: str | None = None
        self._timed = 0

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, (self._token, obj), group=self.group)
        if self._prefix is None:
            self._prefix = f"tritoncomm/bootstrap/{out[0][0]}"
        return [o for _, o in out]

    def barrier(self, timeout: float | None = None) -> None:
        if timeout is None:
            self.all_gather(None)
            return
        store = self._store()
        if store is None or self._prefix is None:
            dist.monitored_barrier(self.group, timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True)
            return
        key = f"{self._prefix}/{self._timed}"
        self._timed += 1
        store.set(f"{key}/r{self.rank}", b"1")
        if store.add(key, 1) == self.world:
            store.set(f"{key}/all", b"1")
        try:
            store.wait([f"{key}/all"], datetime.timedelta(seconds=timeout))
        except Exception as e:  # the store raises its own timeout type
            missing = [r for r in range(self.world) if not store.check([f"{key}/r{r}"])]
            raise BarrierTimeout(self.rank, self.world, missing, timeout) from e
        if store.add(f"{key}/left", 1) == self.world:  # the last rank out removes the barrier's keys
            for k in (key, f"{key}/all", f"{key}/left", *(f"{key}/r{r}" for r in range(self.world))):
                store.delete_key(k)

    def _store(self) -> dist.Store | None:
        try:
            return dist.distributed_c10d._get_process_group_store(self.group or dist.group.WORLD)
        except Exception:
            return None


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
        try:
            self.all_gather(None, timeout)
        except Exception as e:  # the store's own timeout type
            if timeout is None:
                raise
            r = self._round - 1
            missing = [i for i in range(self.world) if not self.store.check([f"{self.prefix}/{r}/{i}"])]
            raise BarrierTimeout(self.rank, self.world, missing, timeout) from e


def default_bootstrap(group: dist.ProcessGroup | None = None) -> Bootstrap:
    """A bootstrap for ``group`` (default: the world). Uses the group itself when it is gloo;
    otherwise creates a gloo group over the same ranks, which is collective over *all* ranks of
    the default group (call it on every rank, in the same order, as for ``dist.new_group``)."""
    if dist.get_backend(group) == "gloo":
        return GroupBootstrap(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    return GroupBootstrap(dist.new_group(ranks=ranks, backend="gloo"))
