"""Tensor-parallel layers and decoder against a single-process reference with the full weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tritoncomm.integrations.tp import (
    LlamaDecoderLayer,
    TorchReducer,
    TritonCommReducer,
    VocabParallelEmbedding,
    rms_norm,
)

from ..helpers import make_comm, same_on_all_ranks, world_sizes
from .tpmodel import HEADS, KV, LAYERS, VOCAB, H, T, tp_weights


def _kv(world: int) -> int:
    """KV heads for a world: 4 (GQA, 2 query heads per KV head) up to world 4; one per rank beyond."""
    return max(KV, world)


def _reference(ids: torch.Tensor, emb: torch.Tensor, kv: int = KV) -> torch.Tensor:
    """Single process, full weights, the same computation order as the TP model."""
    x = F.embedding(ids, emb)
    residual = torch.zeros_like(x)
    partial = x
    d = H // HEADS
    for layer in range(LAYERS):
        w = tp_weights(layer, kv)
        residual = residual + partial
        h = rms_norm(residual, w["input_norm"], 1e-6)
        b, t, _ = h.shape
        q = F.linear(h, w["wq"]).view(b, t, HEADS, d).transpose(1, 2)
        k = F.linear(h, w["wk"]).view(b, t, kv, d).transpose(1, 2).repeat_interleave(HEADS // kv, dim=1)
        v = F.linear(h, w["wv"]).view(b, t, kv, d).transpose(1, 2).repeat_interleave(HEADS // kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d))
        residual = residual + F.linear(a.transpose(1, 2).reshape(b, t, HEADS * d), w["wo"])
        h = rms_norm(residual, w["post_norm"], 1e-6)
        partial = F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
    return (residual + partial).float()


def _finish(ctx, comm, reducer, out, ref):
    """(relative error against the reference, identical on every rank); releases the resources."""
    err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
    same = same_on_all_ranks(ctx, out)
    if isinstance(reducer, TritonCommReducer):
        reducer.close()
    comm.close()
    return err, same


def _job_decoder(ctx, which):
    comm = make_comm(ctx)
    # the default group: NCCL on GPUs, gloo in the CPU world
    reducer = TritonCommReducer(comm, max_tokens=64, hidden=H) if which == "tritoncomm" else TorchReducer(ctx.group)
    emb_w = (torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(7)) * 0.5).to(torch.bfloat16)
    embed = VocabParallelEmbedding(emb_w, reducer).to(ctx.device)
    kv = _kv(ctx.world)
    layers = [LlamaDecoderLayer(tp_weights(i, kv), HEADS, kv, reducer).to(ctx.device) for i in range(LAYERS)]
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        residual = embed(ids.to(ctx.device))  # already summed over ranks: it starts the residual stream
        partial = torch.zeros_like(residual)
        for layer in layers:
            partial = layer(partial, residual)
        out = residual + reducer.all_reduce(partial.contiguous())
    return _finish(ctx, comm, reducer, out, _reference(ids, emb_w, kv))


@pytest.mark.parametrize("world", world_sizes(2, 4))
@pytest.mark.parametrize("which", ["tritoncomm", "torch"])
def test_tp_decoder_matches_single_process_reference(worlds, world, which):
    for err, same in worlds(world).run(_job_decoder, which):
        assert err < 3e-2, f"relative error {err}"
        assert same


CTX, B = 6, 2


def _caches(layer: int, kv: int = KV) -> tuple[torch.Tensor, torch.Tensor]:
    """Full KV caches (B, KV, CTX + 1, d): CTX past tokens, then the step's slot, poisoned so that a
    step that does not write its own K/V there reads garbage."""
    g = torch.Generator().manual_seed(300 + layer)
    k, v = (torch.randn(B, kv, CTX + 1, H // HEADS, generator=g).to(torch.bfloat16) for _ in range(2))
    k[:, :, -1], v[:, :, -1] = 100.0, -100.0
    return k, v


def _decode_reference(x0: torch.Tensor, kv: int = KV) -> torch.Tensor:
    """One decode step (one token per sequence) of the full model over the full caches."""
    residual, partial = x0.clone(), torch.zeros_like(x0)
    d, rep = H // HEADS, HEADS // kv
    for layer in range(LAYERS):
        w = tp_weights(layer, kv)
        kc, vc = _caches(layer, kv)
        residual = residual + partial
        h = rms_norm(residual, w["input_norm"], 1e-6)
        q = F.linear(h, w["wq"]).view(B, 1, HEADS, d).transpose(1, 2)
        k = torch.cat([kc[:, :, :-1], F.linear(h, w["wk"]).view(B, 1, kv, d).transpose(1, 2)], dim=2)
        v = torch.cat([vc[:, :, :-1], F.linear(h, w["wv"]).view(B, 1, kv, d).transpose(1, 2)], dim=2)
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1),
                                           scale=1 / math.sqrt(d))
        residual = residual + F.linear(a.transpose(1, 2).reshape(B, 1, HEADS * d), w["wo"])
        h = rms_norm(residual, w["post_norm"], 1e-6)
        partial = F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
    return (residual + partial).float()


def _job_decode_step(ctx, which):
    comm = make_comm(ctx)
    reducer = TritonCommReducer(comm, max_tokens=64, hidden=H) if which == "tritoncomm" else TorchReducer(ctx.group)
    kv = _kv(ctx.world)
    layers = [LlamaDecoderLayer(tp_weights(i, kv), HEADS, kv, reducer).to(ctx.device) for i in range(LAYERS)]
    kvl = kv // ctx.world
    caches = [tuple(c[:, ctx.rank * kvl:(ctx.rank + 1) * kvl].clone().to(ctx.device) for c in _caches(i, kv))
              for i in range(LAYERS)]
    x0 = torch.randn(B, 1, H, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    with torch.no_grad():
        residual, partial = x0.clone().to(ctx.device), torch.zeros(B, 1, H, dtype=torch.bfloat16, device=ctx.device)
        for layer, cache in zip(layers, caches, strict=True):
            partial = layer(partial, residual, cache)
        out = residual + reducer.all_reduce(partial.contiguous())
        with pytest.raises(ValueError, match="KV cache"):  # a cache of the wrong batch
            layers[0](partial, residual, tuple(c[:1] for c in caches[0]))
    return _finish(ctx, comm, reducer, out, _decode_reference(x0, kv))


@pytest.mark.parametrize("world", world_sizes(2, 4))
@pytest.mark.parametrize("which", ["tritoncomm", "torch"])
def test_tp_decode_step_with_kv_cache_matches_reference(worlds, world, which):
    """GQA decode over a cache in place (merged Q/K/V, the step's K/V written into the last slot)
    equals the full model attending to the past tokens plus the new one."""
    for err, same in worlds(world).run(_job_decode_step, which):
        assert err < 3e-2, f"relative error {err}"
        assert same


def test_column_parallel_shards_reassemble_the_full_linear():
    """Column-parallel outputs of every rank, side by side, equal the full layer; the merged form
    (Q/K/V as one GEMM) gives each part's shard exactly as separate column-parallel linears do."""
    from types import SimpleNamespace

    from tritoncomm.integrations.tp import ColumnParallelLinear, MergedColumnParallelLinear

    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 16, generator=g)
    wq, wk = torch.randn(8, 16, generator=g), torch.randn(4, 16, generator=g)
    world = 2
    parts, merged = [], []
    for rank in range(world):
        red = SimpleNamespace(rank=rank, world=world)
        parts.append((ColumnParallelLinear(wq, red)(x), ColumnParallelLinear(wk, red)(x)))
        merged.append(MergedColumnParallelLinear([wq, wk], red)(x))
    assert torch.allclose(torch.cat([p[0] for p in parts], dim=-1), F.linear(x, wq), atol=1e-5)
    assert torch.allclose(torch.cat([p[1] for p in parts], dim=-1), F.linear(x, wk), atol=1e-5)
    for (q, k), (mq, mk) in zip(parts, merged, strict=True):
        assert torch.allclose(q, mq, atol=1e-5) and torch.allclose(k, mk, atol=1e-5)
