"""``torch.library`` custom ops for the collectives, usable under torch.compile(fullgraph=True),
CUDA-graph capture and eager mode.

Ops carry the group by name and find its ``GroupCollectives`` in ``functional.default_registry``
(set it up first, on every rank). Each op has a fake implementation for tracing:

* ``tritoncomm::all_reduce(Tensor x, str group) -> Tensor`` (new tensor);
* ``tritoncomm::all_reduce_(Tensor(a!) x, str group) -> ()`` (in place);
* ``tritoncomm::all_gather(Tensor x, str group, int world) -> Tensor`` (dim 0 grows ``world`` times);
* ``tritoncomm::reduce_scatter(Tensor x, str group, int world) -> Tensor`` (dim 0 shrinks);
* ``tritoncomm::fused_add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, str group,
  bool gemma=False, Tensor? fp8_scale=None) -> Tensor`` (``residual += all_reduce(x)``; returns the
  normalised rows, FP8 e4m3 when ``fp8_scale`` is given; set up with ``GroupCollectives.setup_fused_norm``,
  else the unfused torch path);
* ``tritoncomm::linear_all_reduce(Tensor x, Tensor w, str group) -> Tensor`` (``all_reduce(x @ w.T)``;
  set up with ``GroupCollectives.setup_gemm``, else matmul then all-reduce).
"""

from __future__ import annotations

import torch

from .functional import default_registry

__all__ = ["all_gather", "all_reduce", "all_reduce_", "fused_add_rms_norm", "linear_all_reduce", "reduce_scatter"]


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


@torch.library.custom_op("tritoncomm::fused_add_rms_norm", mutates_args=("residual",))
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str,
                       gemma: bool = False, fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
    h = x.shape[-1]
    out = default_registry.get(group).add_rms_norm(x.reshape(-1, h).contiguous(), residual.view(-1, h), weight, eps,
                                                   gemma=gemma, fp8_scale=fp8_scale)
    return out.view(x.shape)


@fused_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str, gemma: bool = False,
      fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
    torch._check(residual.shape == x.shape, lambda: "fused_add_rms_norm: residual must match x")
    return torch.empty_like(x, dtype=torch.float8_e4m3fn if fp8_scale is not None else x.dtype)


@torch.library.custom_op("tritoncomm::linear_all_reduce", mutates_args=())
def linear_all_reduce(x: torch.Tensor, w: torch.Tensor, group: str) -> torch.Tensor:
    k = x.shape[-1]
    out = default_registry.get(group).linear_all_reduce(x.reshape(-1, k).contiguous(), w)
    return out.view(*x.shape[:-1], w.shape[0])


@linear_all_reduce.register_fake
def _(x: torch.Tensor, w: torch.Tensor, group: str) -> torch.Tensor:
    torch._check(x.shape[-1] == w.shape[1], lambda: "linear_all_reduce: x and w disagree on K")
    return x.new_empty((*x.shape[:-1], w.shape[0]))
