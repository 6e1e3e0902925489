"""The small Llama-style model of the tensor-parallel tests: its sizes and its full weights, built alike on
every rank (``test_tp``, ``test_graphs_fused``)."""

from __future__ import annotations

import math

import torch

__all__ = ["HEADS", "INTER", "KV", "LAYERS", "T", "VOCAB", "H", "tp_weights"]

#: hidden, query heads, KV heads, MLP width, vocabulary, layers, tokens
H, HEADS, KV, INTER, VOCAB, LAYERS, T = 64, 8, 4, 128, 96, 2, 5


def tp_weights(layer: int, kv: int = KV) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s full weights (bf16), the same on every rank: attention with ``kv`` KV heads, a
    SwiGLU MLP, the two norms."""
    g = torch.Generator().manual_seed(100 + layer)
    d = H // HEADS

    def r(*shape, scale=None):
        return (torch.randn(*shape, generator=g) * (scale or 1 / math.sqrt(shape[-1]))).to(torch.bfloat16)

    return {"wq": r(HEADS * d, H), "wk": r(kv * d, H), "wv": r(kv * d, H), "wo": r(H, HEADS * d),
            "gate": r(INTER, H), "up": r(INTER, H), "down": r(H, INTER),
            "input_norm": (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16),
            "post_norm": (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16)}
