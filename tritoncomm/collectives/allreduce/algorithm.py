"""The all-reduce family's launcher interface (see ``collectives.base.Algorithm``)."""

from __future__ import annotations

import torch

from ..base import Algorithm, PeerOutput
from ..selection import Choice

__all__ = ["AllReduceAlgorithm"]


class AllReduceAlgorithm(Algorithm):
    """An all-reduce algorithm: ``launch`` sums ``x`` over the ranks into ``out`` (which may be
    ``x``) with launch shape ``c``; ``dest`` says where peers may store into ``out`` (only for
    algorithms with ``writes_peer_outputs``); ``sig`` names the call (``kernels.consistency.
    pack_signature``), for the algorithms whose barriers compare it. Host-only: no allocation, sync or
    collective."""

    def launch(self, x: torch.Tensor, out: torch.Tensor, c: Choice, dest: PeerOutput, sig: int | None) -> None:
        raise NotImplementedError
