"""The fused norm family's launcher interface (see ``collectives.base.Algorithm``)."""

from __future__ import annotations

from types import MappingProxyType

import torch

from ...channels import Communicator
from ...kernels import pow2_at_least
from ...units import round_up
from ..base import Algorithm
from .rows import RowPlan

__all__ = ["MIN_BLOCK_C", "FusedAlgorithm"]

#: The fewest columns per block: 32 LL words of 16-bit values, one per thread of a warp.
MIN_BLOCK_C = 64


class FusedAlgorithm(Algorithm):
    """A variant of the fused all-reduce + residual add + RMSNorm (+ FP8): ``launch`` runs it on
    ``x`` (tokens, hidden) with the caller's already validated tensors. Every variant's buffer ends
    with its row exchange (``fused_norm.rows``), ``xch_rel`` bytes into the channel's buffer.
    ``capacity`` bounds ``tokens x hidden x 2`` bytes; ``plan`` says how rows are cut."""

    shapes = MappingProxyType({"cuda": (64, 1024, 4), "cpu": (2, 1024, 1)})

    def __init__(self, comm: Communicator, capacity: int, grid: int, tag: str, plan: RowPlan) -> None:
        self.plan = plan
        self.rows = plan.rows_for(capacity)  # the most rows a launch serves
        super().__init__(comm, capacity, grid, tag)

    @property
    def exchange_bytes(self) -> int:
        """The row exchange: one LL8 packet per (row, chunk) of the largest input."""
        return round_up(self.plan.max_tokens * self.plan.max_chunks * 8, 256)

    def launch(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
               out: torch.Tensor, scale: torch.Tensor, *, gemma: bool, fp8: bool, eps: float,
               engine: bool = False, sig: int | None = None) -> None:
        """Run the variant; ``engine``: the unfused path's rounding points (``fused_norm.rows``:
        ``add_residual``, ``norm_values``); ``sig``: the call's signature
        (``kernels.consistency.pack_signature``), for the variants whose barriers compare it."""
        raise NotImplementedError

    def _args(self, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor, weight: torch.Tensor,
              out: torch.Tensor, scale: torch.Tensor, cw: int, eps: float) -> tuple:
        """The arguments every variant's kernel starts with."""
        bases, rank, _, timeout, diag = self.comm.kernel_args()
        t, h = x.shape
        return (x, residual, residual_out, weight, out, scale, t, h, cw, eps, bases, rank, timeout, diag)

    def _meta(self, chunks: int, block: int, tile: int, gemma: bool, fp8: bool, engine: bool,
              polled: int | None = None, warps: int | None = None) -> dict:
        """The constexprs every variant's kernel takes; ``tile``: its largest access, in elements;
        ``warps``: the variant's own choice (default 8 for tiles of 4096 elements or more, else 4);
        ``polled``: the elements (LL: words) of the smallest block its waits look at, if any. Such
        a block gets at least one per thread (``kernels.lamport``: a look at a block copied across
        threads counts one copy), whatever the warps asked for."""
        if warps is None:
            warps = 8 if tile >= 4096 else 4
        if polled is not None:
            warps = max(1, min(warps, polled // 32))
        meta = {"WORLD": self.world, "CH": chunks, "BLOCK_C": block, "GEMMA": gemma, "FP8": fp8, "ENGINE": engine,
                "num_warps": warps}
        if self.plan.tree:  # only the variants that serve batch-invariant rows take it (``rows.py``)
            meta["TREE"] = True
        return meta

    @staticmethod
    def _block(cw: int) -> int:
        """Columns per block for chunks of ``cw``: a power of two, at least ``MIN_BLOCK_C`` (so that a
        block of 16-bit values is at least one LL word per thread of a warp)."""
        return max(MIN_BLOCK_C, pow2_at_least(cw))
