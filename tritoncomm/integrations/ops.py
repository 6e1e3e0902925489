"""``torch.library`` custom ops for the collectives, usable under torch.compile(fullgraph=True),
CUDA-graph capture and eager mode.

Ops carry the group by name and find its ``GroupCollectives`` in ``functional.default_registry``
(set it up first, on every rank). Each op has a fake implementation for tracing:

* ``tritoncomm::all_reduce(Tensor x, str group) -> Tensor`` (new tensor);
* ``tritoncomm::all_reduce_(Tensor(a!) x, str group) -> ()`` (in place);
* ``tritoncomm::all_gather(Tensor x, str group, int world) -> Tensor`` (dim 0 grows ``world`` times);
* ``tritoncomm::reduce_scatter(Tensor x, str group, int world) -> Tensor`` (dim 0 shrinks).
"""

from __future__ import annotations

import torch

from .functional import default_registry

__all__ = ["all_gather", "all_reduce", "all_reduce_", "reduce_scatter"]


@torch.library.custom_op("tritoncomm::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    return default_registry.get(group).all_reduce_out(x)


@all_reduce.register_fake
def _(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("tritoncomm::all_reduce_", mutates_args=("x",))
def all_reduce_(x: torch.Tensor, group: str) -> None:
    default_registry.get(group).all_reduce(x)


@all_reduce_.register_fake
def _(x: torch.Tensor, group: str) -> None:
    return None


@torch.library.custom_op("tritoncomm::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = x.new_empty((world * x.shape[0], *x.shape[1:]))
    return default_registry.get(group).all_gather_into_tensor(out, x.contiguous())


@all_gather.register_fake
def _(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    return x.new_empty((world * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("tritoncomm::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // world, *x.shape[1:]))
    return default_registry.get(group).reduce_scatter_tensor(out, x.contiguous())


@reduce_scatter.register_fake
def _(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    torch._check(x.shape[0] % world == 0, lambda: "reduce_scatter: dim 0 must split into world equal parts")
    return x.new_empty((x.shape[0] // world, *x.shape[1:]))
