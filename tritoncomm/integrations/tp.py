"""Tensor-parallel layers and a Llama-style decoder layer built on them.

Every reduction goes through a ``Reducer``: ``TritonCommReducer`` (tritoncomm's all-reduce, and the
fused all-reduce + residual add + RMSNorm where a norm follows) or ``TorchReducer``
(torch.distributed, e.g. NCCL, then torch's add + RMSNorm). A layer never reduces on its own when
a fused norm follows: row-parallel outputs stay partial until the next ``FusedAddRMSNorm``.

Weights are sharded from full tensors every rank creates alike (random here; no downloads), so a
single-process model with the full weights is the reference.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..channels import Communicator
from ..collectives import AllReduce, FusedAllReduceAddRMSNorm

__all__ = ["ColumnParallelLinear", "FusedAddRMSNorm", "LlamaDecoderLayer", "Reducer", "RowParallelLinear",
           "TorchReducer", "TritonCommReducer", "VocabParallelEmbedding", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    v = x.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class Reducer:
    """What the layers need from a communication backend."""

    rank: int
    world: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns ``x``."""
        raise NotImplementedError

    def add_rms_norm(self, partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """``residual += all_reduce(partial)`` in place; returns ``rmsnorm(residual) * weight``."""
        raise NotImplementedError


class TorchReducer(Reducer):
    """torch.distributed all-reduce, then torch's add and RMSNorm (the unfused baseline)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def add_rms_norm(self, partial, residual, weight, eps):
        residual.add_(self.all_reduce(partial))
        return rms_norm(residual, weight, eps)


class TritonCommReducer(Reducer):
    """tritoncomm's all-reduce and fused all-reduce + add + RMSNorm."""

    def __init__(self, comm: Communicator, *, max_tokens: int, hidden: int, max_bytes: int | None = None,
                 eps: float = 1e-6, fallback_group: dist.ProcessGroup | None = None) -> None:
        self.rank, self.world = comm.rank, comm.world
        max_bytes = max_bytes or max(1 << 20, 4 * max_tokens * hidden)
        self.ar = AllReduce(comm, max_bytes=max_bytes, fallback_group=fallback_group)
        self.fused = FusedAllReduceAddRMSNorm(comm, max_tokens=max_tokens, max_hidden=hidden, eps=eps)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.ar(x, out=x)

    def add_rms_norm(self, partial, residual, weight, eps):
        shape = partial.shape
        out = self.fused(partial.reshape(-1, shape[-1]), residual.view(-1, shape[-1]), weight)
        return out.view(shape)

    def close(self) -> None:
        self.ar.close()
        self.fused.close()


def _shard(full: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    if full.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {full.shape[dim]} does not split over {world} ranks")
    return full.chunk(world, dim=dim)[rank].contiguous()


class ColumnParallelLinear(nn.Module):
    """``y = x @ W.T`` with ``W``'s rows (output features) split over ranks; output stays sharded."""

    def __init__(self, full_weight: torch.Tensor, reducer: Reducer) -> None:
        super().__init__()
        self.weight = nn.Parameter(_shard(full_weight, 0, reducer.rank, reducer.world), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """``y = x @ W.T`` with ``W``'s columns (input features) split; ``reduce=True`` sums the partial
    products over ranks, ``reduce=False`` returns the partial product for a fused reduction."""

    def __init__(self, full_weight: torch.Tensor, reducer: Reducer, reduce: bool = True) -> None:
        super().__init__()
        self.reducer = reducer
        self.reduce = reduce
        self.weight = nn.Parameter(_shard(full_weight, 1, reducer.rank, reducer.world), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return self.reducer.all_reduce(y.contiguous()) if self.reduce else y


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over ranks; each rank looks up its rows, zeros the rest, and sums."""

    def __init__(self, full_weight: torch.Tensor, reducer: Reducer) -> None:
        super().__init__()
        self.reducer = reducer
        self.weight = nn.Parameter(_shard(full_weight, 0, reducer.rank, reducer.world), requires_grad=False)
        self.start = reducer.rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * inside.unsqueeze(-1)
        return self.reducer.all_reduce(out.contiguous())


class FusedAddRMSNorm(nn.Module):
    """Takes a partial (un-reduced) activation and the residual: reduces, adds, normalises."""

    def __init__(self, weight: torch.Tensor, reducer: Reducer, eps: float = 1e-6) -> None:
        super().__init__()
        self.reducer, self.eps = reducer, eps
        self.weight = nn.Parameter(weight.clone(), requires_grad=False)

    def forward(self, partial: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.reducer.add_rms_norm(partial.contiguous(), residual, self.weight, self.eps)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention (GQA, causal) + SwiGLU MLP, tensor-parallel over heads and intermediate.

    ``forward(partial, residual)`` takes the previous layer's partial output and the residual
    stream (updated in place) and returns this layer's partial output. No rotary embedding: the
    layer exists to exercise the communication pattern, not to reproduce a checkpoint.
    """

    def __init__(self, weights: dict[str, torch.Tensor], n_heads: int, n_kv_heads: int, reducer: Reducer,
                 eps: float = 1e-6) -> None:
        super().__init__()
        w = reducer.world
        if n_heads % w or n_kv_heads % w:
            raise ValueError(f"{n_heads} heads / {n_kv_heads} KV heads do not split over {w} ranks")
        self.heads, self.kv_heads = n_heads // w, n_kv_heads // w
        self.head_dim = weights["wq"].shape[0] // n_heads
        self.input_norm = FusedAddRMSNorm(weights["input_norm"], reducer, eps)
        self.post_norm = FusedAddRMSNorm(weights["post_norm"], reducer, eps)
        self.wq = ColumnParallelLinear(weights["wq"], reducer)
        self.wk = ColumnParallelLinear(weights["wk"], reducer)
        self.wv = ColumnParallelLinear(weights["wv"], reducer)
        self.wo = RowParallelLinear(weights["wo"], reducer, reduce=False)
        self.gate = ColumnParallelLinear(weights["gate"], reducer)
        self.up = ColumnParallelLinear(weights["up"], reducer)
        self.down = RowParallelLinear(weights["down"], reducer, reduce=False)

    def attention(self, h: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, t, _ = h.shape
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if past is not None:  # decode: one new token per sequence attends to the cache and itself
            if t != 1:
                raise ValueError(f"a KV cache serves decode steps (one new token per sequence), got {t} tokens")
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None, scale=1 / math.sqrt(self.head_dim))
        return self.wo(a.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def forward(self, partial: torch.Tensor, residual: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``past``: this rank's KV cache ``(k, v)``, each (batch, local KV heads, context, head_dim),
        read only (the new token's K/V are not appended: a fixed-shape step for benchmarks)."""
        h = self.input_norm(partial, residual)
        h = self.post_norm(self.attention(h, past), residual)
        return self.down(F.silu(self.gate(h)) * self.up(h))
