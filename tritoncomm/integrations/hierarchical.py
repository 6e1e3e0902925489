"""All-reduce beyond one node: tritoncomm inside each node, NCCL (torch.distributed) between nodes.

1. reduce-scatter inside the node with tritoncomm;
2. all-reduce of this rank's shard across nodes, among the ranks with the same local rank;
3. all-gather inside the node with tritoncomm.

``node_groups`` builds the groups from the launcher's environment (``LOCAL_WORLD_SIZE``, i.e.
ranks per node, consecutive ranks on one node, as torchrun lays them out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import settings
from ..channels import Communicator
from ..collectives import AllGather, ReduceScatter
from ..collectives.validation import check_input, check_out
from ..config import CommConfig
from ..errors import InvalidInputError
from ..units import cdiv, round_up

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
    local_world = local_world or settings.local_world_size(world)
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
    """Sum all-reduce over all ranks of all nodes. Collective to create and close.

    Inputs up to ``max_bytes`` take the three steps above; the padded input and this rank's shard
    live in workspace allocated here (``3 x max_bytes / 2`` bytes at 2 ranks per node, less with
    more), so a call allocates nothing but its result when ``out`` is not given. Larger inputs go to
    one NCCL all-reduce over the default group (every rank of every node). One instance per stream:
    two calls in flight on two streams would share the workspace and the collectives' signal slots."""

    def __init__(self, groups: NodeGroups, *, max_bytes: int = 64 << 20, config: CommConfig | None = None,
                 device: torch.device | None = None) -> None:
        self.groups = groups
        self.max_bytes = max_bytes
        self.comm = Communicator(groups.local_cpu, config=config, device=device)
        self.rs = ReduceScatter(self.comm, max_bytes=max_bytes, fallback_group=groups.local_device)
        self.ag = AllGather(self.comm, max_bytes=max_bytes, fallback_group=groups.local_device)
        lw = groups.local_world
        # whole-input bytes, rounded so that every dtype's shard starts 16-byte aligned
        self._padded_bytes = round_up(max_bytes, 16 * lw)
        self._workspace = torch.empty(self._padded_bytes + self._padded_bytes // lw, dtype=torch.uint8,
                                      device=self.comm.device)

    def _views(self, dtype: torch.dtype, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded input (``m x local_world`` elements) and my shard (``m``), in ``dtype``."""
        lw = self.groups.local_world
        ws = self._workspace
        padded = ws[:self._padded_bytes].view(dtype)[:m * lw]
        shard = ws[self._padded_bytes:].view(dtype)[:m]
        return padded, shard

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The sum of ``x`` over every rank, in ``out`` if given (``out=x``: in place), else in a new
        tensor."""
        check_input(x, self.comm.device, "hierarchical all_reduce")
        if out is None:
            out = torch.empty_like(x)
        else:
            check_out(out, x, x.numel(), "hierarchical all_reduce", may_alias=True)
        n = x.numel()
        if n == 0:
            return out
        if n * x.element_size() > self.max_bytes:
            if out.data_ptr() != x.data_ptr():
                out.copy_(x)
            dist.all_reduce(out)
            return out
        lw = self.groups.local_world
        m = cdiv(n, lw)
        padded, shard = self._views(x.dtype, m)
        flat, o = x.view(-1), out.view(-1)
        if n % lw == 0:  # straight from x into out (the reduce-scatter has read x before out is written)
            self.rs(flat, shard)
            dist.all_reduce(shard, group=self.groups.inter)
            self.ag(shard, o)
            return out
        padded[:n].copy_(flat)
        padded[n:].zero_()
        self.rs(padded, shard)
        dist.all_reduce(shard, group=self.groups.inter)
        self.ag(shard, padded)
        o.copy_(padded[:n])
        return out

    def close(self) -> None:
        self.rs.close()
        self.ag.close()
        self.comm.close()
