"""A torch.distributed-style API over an existing ProcessGroup, set up from it once.

``GroupCollectives(group)`` probes the group (one collective vote), and, if tritoncomm can serve
it, builds a communicator and one all-reduce, all-gather and reduce-scatter on it; otherwise (or for
sizes past ``max_bytes``) every call goes to torch.distributed on ``group``. ``Registry`` holds one
``GroupCollectives`` per group name, so that the custom ops below, which can only carry
strings, find theirs; ``tritoncomm.all_reduce(t, group)`` uses the registry ``default_registry``.
Setting up is collective and happens at the first call for a group (or at ``Registry.setup``):
call it on every rank in the same order, and before CUDA-graph capture.

Custom ops (``torch.library``), usable under ``torch.compile(fullgraph=True)``, CUDA-graph capture
and eager mode, carry the group by name and find its ``GroupCollectives`` in ``default_registry``
(set it up first, on every rank). Each op has a fake implementation for tracing:
* ``tritoncomm::all_reduce(Tensor x, str group) -> Tensor`` (new tensor);
* ``tritoncomm::all_reduce_(Tensor(a!) x, str group) -> ()`` (in place);
* ``tritoncomm::all_gather(Tensor x, str group, int world) -> Tensor`` (dim 0 grows ``world`` times);
* ``tritoncomm::reduce_scatter(Tensor x, str group, int world) -> Tensor`` (dim 0 shrinks);
* ``tritoncomm::all_to_all(Tensor x, str group) -> Tensor`` (``all_to_all_single`` with equal splits;
  set up with ``GroupCollectives.setup_all_to_all``, else torch.distributed's);
* ``tritoncomm::fused_add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, str group,
  bool gemma=False, Tensor? fp8_scale=None) -> Tensor`` (``residual += all_reduce(x)``; returns the
  normalised rows, FP8 e4m3 when ``fp8_scale`` is given; set up with ``GroupCollectives.setup_fused_norm``,
  else the unfused torch path);
* ``tritoncomm::linear_all_reduce(Tensor x, Tensor w, str group) -> Tensor`` (``all_reduce(x @ w.T)``;
  set up with ``GroupCollectives.setup_gemm``, else matmul then all-reduce).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import AllGather, AllReduce, AllToAll, FusedAllReduceAddRMSNorm, GemmAllReduce, ReduceScatter
from ..config import CommConfig
from .capability import Verdict, probe

__all__ = ["GroupCollectives", "Registry", "all_gather_into_tensor", "all_reduce", "all_to_all_single",
           "default_registry", "reduce_scatter_tensor", "shutdown"]


def _cpu_group_for(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    if dist.get_backend(group) == "gloo":
        return group or dist.group.WORLD
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    return dist.new_group(ranks=ranks, backend="gloo")  # collective over the default group


class GroupCollectives:
    """tritoncomm's collectives for one process group, with torch.distributed as the fallback."""

    def __init__(self, group: dist.ProcessGroup | None = None, *, cpu_group: dist.ProcessGroup | None = None,
                 device: torch.device | None = None, max_bytes: int = 64 << 20,
                 config: CommConfig | None = None) -> None:
        self.group = group or dist.group.WORLD
        self.cpu_group = cpu_group or _cpu_group_for(group)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and \
                dist.get_backend(self.group) == "nccl" else torch.device("cpu")
        self.device = device
        self.verdict: Verdict = probe(self.cpu_group, device, config)
        self.comm: Communicator | None = None
        if self.verdict.ok:
            self.comm = Communicator(self.cpu_group, config=config, device=device)
            self.ar = AllReduce(self.comm, max_bytes=max_bytes, fallback_group=self.group)
            self.ag = AllGather(self.comm, max_bytes=max_bytes, fallback_group=self.group)
            self.rs = ReduceScatter(self.comm, max_bytes=max_bytes, fallback_group=self.group)
        else:
            self.verdict.log_once()
        self.world = dist.get_world_size(self.group)
        self.fused: FusedAllReduceAddRMSNorm | None = None
        self.gemm: dict[int, GemmAllReduce] = {}
        self.a2a: AllToAll | None = None

    def setup_all_to_all(self, max_bytes: int) -> None:
        """Collective: set up the all-to-all (equal splits) for inputs up to ``max_bytes`` (its
        workspace, about twice that, comes from the group's heap)."""
        if self.comm is not None and self.a2a is None:
            self.a2a = AllToAll(self.comm, max_bytes=max_bytes, fallback_group=self.group)

    def setup_fused_norm(self, max_tokens: int, hidden: int, eps: float = 1e-6) -> None:
        """Collective: set up the fused all-reduce + add + RMSNorm for inputs up to ``max_tokens`` x ``hidden``."""
        if self.comm is not None and self.fused is None:
            self.fused = FusedAllReduceAddRMSNorm(self.comm, max_tokens=max_tokens, max_hidden=hidden, eps=eps)

    def setup_gemm(self, max_tokens: int, n: int, **kwargs) -> None:
        """Collective: set up GEMM + all-reduce for outputs up to ``max_tokens`` x ``n``."""
        if self.comm is not None and n not in self.gemm:
            self.gemm[n] = GemmAllReduce(self.comm, max_tokens, n, allreduce=self.ar, **kwargs)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                     gemma: bool = False, fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``residual += all_reduce(x)`` (in place); returns ``rmsnorm(residual) * weight`` (``1 + weight``
        with ``gemma``), or its FP8 e4m3 quantisation ``clamp(y / fp8_scale, -448, 448)``."""
        fused = self.fused
        if fused is None or x.shape[0] > fused.max_tokens or x.shape[-1] > fused.max_hidden or eps != fused.eps:
            residual.add_(self.all_reduce_out(x))
            v = residual.float()
            w = weight.float() + 1.0 if gemma else weight.float()
            y = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w
            if fp8_scale is not None:
                return (y / fp8_scale.float()).clamp(-448, 448).to(torch.float8_e4m3fn)
            return y.to(x.dtype)
        return fused(x, residual, weight, gemma=gemma, fp8_scale=fp8_scale)

    def linear_all_reduce(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``all_reduce(x @ w.T)`` (row-parallel linear), overlapped where set up and worthwhile."""
        g = self.gemm.get(w.shape[0])
        if g is None or x.shape[0] > g.max_tokens:
            return self.all_reduce(torch.matmul(x, w.t()))
        return g(x, w)

    @property
    def enabled(self) -> bool:
        return self.comm is not None

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """In place, like ``dist.all_reduce(t, group)``; returns ``t``."""
        if self.comm is None:
            dist.all_reduce(t, group=self.group)
            return t
        return self.ar(t, out=t)

    def all_reduce_out(self, t: torch.Tensor) -> torch.Tensor:
        """Out of place: a new tensor with the sum."""
        if self.comm is None:
            out = t.clone()
            dist.all_reduce(out, group=self.group)
            return out
        return self.ar(t)

    def all_gather_into_tensor(self, out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            dist.all_gather_into_tensor(out, t, group=self.group)
            return out
        return self.ag(t, out)

    def reduce_scatter_tensor(self, out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            dist.reduce_scatter_tensor(out, t, group=self.group)
            return out
        return self.rs(t, out)

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``dist.all_to_all_single(out, t, group)`` with equal splits (tritoncomm's once set up)."""
        if self.a2a is None:
            dist.all_to_all_single(out, t, group=self.group)
            return out
        return self.a2a(t, out)

    def close(self) -> None:
        if self.comm is not None:
            for c in (*self.gemm.values(), *([self.fused] if self.fused else []), *([self.a2a] if self.a2a else []),
                      self.ar, self.ag, self.rs):
                c.close()
            self.comm.close()
            self.comm = None
            self.gemm.clear()
            self.fused = None
            self.a2a = None


class Registry:
    """``GroupCollectives`` by group name. Explicit state: ``setup``, ``get``, ``close``."""

    def __init__(self) -> None:
        self._groups: dict[str, GroupCollectives] = {}

    @staticmethod
    def name_of(group: dist.ProcessGroup | None) -> str:
        return (group or dist.group.WORLD).group_name

    def setup(self, group: dist.ProcessGroup | None = None, **kwargs) -> GroupCollectives:
        """Collective: set up tritoncomm for ``group`` (once; later calls return the same)."""
        name = self.name_of(group)
        if name not in self._groups:
            self._groups[name] = GroupCollectives(group, **kwargs)
        return self._groups[name]

    def get(self, name: str) -> GroupCollectives:
        try:
            return self._groups[name]
        except KeyError:
            raise KeyError(f"tritoncomm has not been set up for group {name!r}: call "
                           "tritoncomm.integrations.default_registry.setup(group) on every rank first") from None

    def close(self) -> None:
        for g in self._groups.values():
            g.close()
        self._groups.clear()


#: The registry behind ``tritoncomm.all_reduce`` & co. and the custom ops.
default_registry = Registry()


def all_reduce(t: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``dist.all_reduce(t, group=group)`` (sum, in place) through tritoncomm when it can serve."""
    return default_registry.setup(group).all_reduce(t)


def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor,
                           group: dist.ProcessGroup | None = None) -> torch.Tensor:
    return default_registry.setup(group).all_gather_into_tensor(out, t)


def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor,
                          group: dist.ProcessGroup | None = None) -> torch.Tensor:
    return default_registry.setup(group).reduce_scatter_tensor(out, t)


def all_to_all_single(out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``dist.all_to_all_single(out, t, group=group)`` with equal splits, through tritoncomm once
    ``setup_all_to_all`` has run for the group."""
    return default_registry.setup(group).all_to_all_single(out, t)


def shutdown() -> None:
    """Collective: close everything ``default_registry`` set up."""
    default_registry.close()


# -- custom ops ---------------------------------------------------------------------------------


@torch.library.custom_op("tritoncomm::all_reduce", mutates_args=())
def _op_all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    return default_registry.get(group).all_reduce_out(x)


@_op_all_reduce.register_fake
def _(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("tritoncomm::all_reduce_", mutates_args=("x",))
def _op_all_reduce_(x: torch.Tensor, group: str) -> None:
    default_registry.get(group).all_reduce(x)


@_op_all_reduce_.register_fake
def _(x: torch.Tensor, group: str) -> None:
    return None


@torch.library.custom_op("tritoncomm::all_gather", mutates_args=())
def _op_all_gather(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = x.new_empty((world * x.shape[0], *x.shape[1:]))
    return default_registry.get(group).all_gather_into_tensor(out, x.contiguous())


@_op_all_gather.register_fake
def _(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    return x.new_empty((world * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("tritoncomm::reduce_scatter", mutates_args=())
def _op_reduce_scatter(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // world, *x.shape[1:]))
    return default_registry.get(group).reduce_scatter_tensor(out, x.contiguous())


@_op_reduce_scatter.register_fake
def _(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    torch._check(x.shape[0] % world == 0, lambda: "reduce_scatter: dim 0 must split into world equal parts")
    return x.new_empty((x.shape[0] // world, *x.shape[1:]))


@torch.library.custom_op("tritoncomm::all_to_all", mutates_args=())
def _op_all_to_all(x: torch.Tensor, group: str) -> torch.Tensor:
    return default_registry.get(group).all_to_all_single(torch.empty_like(x), x.contiguous())


@_op_all_to_all.register_fake
def _(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("tritoncomm::fused_add_rms_norm", mutates_args=("residual",))
def _op_fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str,
                       gemma: bool = False, fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
    h = x.shape[-1]
    out = default_registry.get(group).add_rms_norm(x.reshape(-1, h).contiguous(), residual.view(-1, h), weight, eps,
                                                   gemma=gemma, fp8_scale=fp8_scale)
    return out.view(x.shape)


@_op_fused_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str, gemma: bool = False,
      fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
    torch._check(residual.shape == x.shape, lambda: "fused_add_rms_norm: residual must match x")
    return torch.empty_like(x, dtype=torch.float8_e4m3fn if fp8_scale is not None else x.dtype)


@torch.library.custom_op("tritoncomm::linear_all_reduce", mutates_args=())
def _op_linear_all_reduce(x: torch.Tensor, w: torch.Tensor, group: str) -> torch.Tensor:
    k = x.shape[-1]
    out = default_registry.get(group).linear_all_reduce(x.reshape(-1, k).contiguous(), w)
    return out.view(*x.shape[:-1], w.shape[0])


@_op_linear_all_reduce.register_fake
def _(x: torch.Tensor, w: torch.Tensor, group: str) -> torch.Tensor:
    torch._check(x.shape[-1] == w.shape[1], lambda: "linear_all_reduce: x and w disagree on K")
    return x.new_empty((*x.shape[:-1], w.shape[0]))
