"""All-reduce beyond one node: tritoncomm inside each node, NCCL (torch.distributed) between nodes.

1. reduce-scatter inside the node with tritoncomm;
2. all-reduce of this rank's shard across nodes, among the ranks with the same local rank;
3. all-gather inside the node with tritoncomm.

``node_groups`` builds the groups from the launcher's environment (``LOCAL_WORLD_SIZE``, i.e.
ranks per node, consecutive ranks on one node, as torchrun lays them out).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import AllGather, ReduceScatter
from ..config import CommConfig
from ..errors import InvalidInputError

__all__ = ["HierarchicalAllReduce", "NodeGroups", "node_groups"]


@dataclass
class NodeGroups:
    local_world: int
    local_rank: int
    node: int
    local_cpu: dist.ProcessGroup  # gloo, this node's ranks
    local_device: dist.ProcessGroup  # this node's ranks, device backend (for fallbacks)
    inter: dist.ProcessGroup  # the ranks with my local rank, one per node (device backend)


def node_groups(local_world: int | None = None, backend: str | None = None) -> NodeGroups:
    """Collective over the default group: every rank creates every node's and every column's
    groups, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    local_world = local_world or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % local_world:
        raise InvalidInputError(f"world {world} is not a multiple of {local_world} ranks per node")
    backend = backend or dist.get_backend()
    nodes = world // local_world
    mine = {}
    for n in range(nodes):
        ranks = list(range(n * local_world, (n + 1) * local_world))
        cpu = dist.new_group(ranks, backend="gloo")
        dev = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            mine["local_cpu"], mine["local_device"] = cpu, dev
    for lr in range(local_world):
        g = dist.new_group([n * local_world + lr for n in range(nodes)], backend=backend)
        if rank % local_world == lr:
            mine["inter"] = g
    return NodeGroups(local_world, rank % local_world, rank // local_world, **mine)


class HierarchicalAllReduce:
    """Sum all-reduce over all ranks of all nodes. Collective to create and close."""

    def __init__(self, groups: NodeGroups, *, max_bytes: int = 64 << 20, config: CommConfig | None = None,
                 device: torch.device | None = None) -> None:
        self.groups = groups
        self.comm = Communicator(groups.local_cpu, config=config, device=device)
        self.rs = ReduceScatter(self.comm, max_bytes=max_bytes, fallback_group=groups.local_device)
        self.ag = AllGather(self.comm, max_bytes=max_bytes, fallback_group=groups.local_device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """A new tensor with the sum of ``x`` over every rank."""
        lw = self.groups.local_world
        n = x.numel()
        m = -(-n // lw)
        flat = x.reshape(-1)
        if n % lw:
            padded = flat.new_zeros(m * lw)
            padded[:n] = flat
            flat = padded
        shard = self.rs(flat)
        dist.all_reduce(shard, group=self.groups.inter)
        full = self.ag(shard)
        return full[:n].view(x.shape)

    def close(self) -> None:
        self.rs.close()
        self.ag.close()
        self.comm.close()
