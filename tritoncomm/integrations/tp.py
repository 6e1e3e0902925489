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
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..channels import Communicator
from ..collectives import AllReduce, FusedAllReduceAddRMSNorm

__all__ = ["ColumnParallelLinear", "FusedAddRMSNorm", "LlamaDecoderLayer", "MergedColumnParallelLinear", "Reducer",
           "RowParallelLinear", "TorchReducer", "TritonCommReducer", "VocabParallelEmbedding", "rms_norm"]


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


class MergedColumnParallelLinear(nn.Module):
    """Several column-parallel linears that share their input, as one GEMM (Q/K/V, or gate/up).

    Each full weight's rows are split over ranks as ``ColumnParallelLinear`` splits them; this
    rank's shards are stacked into one weight, and ``forward`` returns the per-weight outputs (views
    of one product) in order. Same results as separate linears; one weight read and one launch.
    """

    def __init__(self, full_weights: Sequence[torch.Tensor], reducer: Reducer) -> None:
        super().__init__()
        shards = [_shard(w, 0, reducer.rank, reducer.world) for w in full_weights]
        self.sizes = [s.shape[0] for s in shards]
        self.weight = nn.Parameter(torch.cat(shards), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.weight).split(self.sizes, dim=-1)


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
    stream (updated in place) and returns this layer's partial output. Q/K/V and gate/up are one
    GEMM each (``MergedColumnParallelLinear``), and a decode step attends to its KV cache in place
    (no copy of the cache per step), as engines do, so the step's time is the weights' reads and the
    reductions rather than avoidable copies. No rotary embedding: the layer exists to exercise the
    communication pattern, not to reproduce a checkpoint.
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
        self.qkv = MergedColumnParallelLinear([weights["wq"], weights["wk"], weights["wv"]], reducer)
        self.wo = RowParallelLinear(weights["wo"], reducer, reduce=False)
        self.gate_up = MergedColumnParallelLinear([weights["gate"], weights["up"]], reducer)
        self.down = RowParallelLinear(weights["down"], reducer, reduce=False)

    def attention(self, h: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, t, _ = h.shape
        d, kvh, rep = self.head_dim, self.kv_heads, self.heads // self.kv_heads
        q, k, v = self.qkv(h)
        q = q.view(b, t, self.heads, d).transpose(1, 2)
        k = k.view(b, t, kvh, d).transpose(1, 2)
        v = v.view(b, t, kvh, d).transpose(1, 2)
        scale = 1 / math.sqrt(d)
        if cache is None:  # prefill: causal over the t tokens; query head j reads KV head j // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            return self.wo(a.transpose(1, 2).reshape(b, t, self.heads * d))
        if t != 1:
            raise ValueError(f"a KV cache serves decode steps (one new token per sequence), got {t} tokens")
        kc, vc = cache
        if kc.shape != vc.shape or kc.shape[:2] != (b, kvh) or kc.shape[3] != d or kc.shape[2] < 1:
            raise ValueError(f"KV cache of shape {tuple(kc.shape)}/{tuple(vc.shape)} does not fit "
                             f"(batch {b}, {kvh} local KV heads, context + 1, head_dim {d})")
        kc[:, :, -1:].copy_(k)  # this step's slot
        vc[:, :, -1:].copy_(v)
        # GQA without copying the cache: the rep query heads of KV head g are its rows of queries
        a = F.scaled_dot_product_attention(q.reshape(b, kvh, rep, d), kc, vc, scale=scale)
        return self.wo(a.reshape(b, 1, self.heads * d))

    def forward(self, partial: torch.Tensor, residual: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``cache``: this rank's KV cache ``(k, v)`` for a decode step, each (batch, local KV heads,
        context + 1, head_dim): the layer writes the new token's K/V into the last position and
        attends over all of it (engines' write-then-attend; a fixed shape, so a step replays in a
        CUDA graph). Without it: prefill, causal over the input's tokens."""
        h = self.input_norm(partial, residual)
        h = self.post_norm(self.attention(h, cache), residual)
        g, u = self.gate_up(h)
        return self.down(F.silu(g) * u)
