"""Fused tensor-parallel epilogues: host side (kernel in ``fused_norm``)."""

from __future__ import annotations

import torch
import triton

from ..channels import Channel, Communicator
from ..errors import InvalidInputError
from .fused_norm import allreduce_add_rmsnorm_kernel
from .validation import check_input

__all__ = ["MAX_HIDDEN", "FusedAllReduceAddRMSNorm"]

#: Largest hidden size one program normalises in one step.
MAX_HIDDEN = 16384


class FusedAllReduceAddRMSNorm:
    """``residual += all_reduce(x)`` in place; returns ``rmsnorm(residual) * weight`` (or
    ``* (1 + weight)`` with ``gemma=True``), in ``x``'s dtype or, given ``fp8_scale``, FP8 e4m3.

    Args:
        comm: the communicator.
        max_tokens, max_hidden: the largest ``x`` (tokens x hidden) served; ``max_hidden <= 16384``.
        eps: the RMSNorm epsilon.
        programs: the (fixed) grid; each program handles whole rows.

    Inputs are bf16 or fp16, contiguous, ``(tokens, hidden)``. Accumulation is fp32, ranks in order,
    so every rank gets the same bits. Collective to create and close.
    """

    def __init__(self, comm: Communicator, max_tokens: int, max_hidden: int, *, eps: float = 1e-6,
                 programs: int | None = None, name: str = "fused_add_rmsnorm") -> None:
        if not 0 < max_hidden <= MAX_HIDDEN:
            raise InvalidInputError(f"max_hidden must be in 1..{MAX_HIDDEN}, got {max_hidden}")
        self.comm = comm
        self.max_tokens, self.max_hidden, self.eps = max_tokens, max_hidden, eps
        self.programs = programs or (64 if comm.backend == "cuda" else 2)
        self._slot = -(-(max_tokens * max_hidden * 2) // 256) * 256
        self.channel = Channel(comm, name, programs=self.programs, barrier_slots=self.programs,
                               buffer_bytes=2 * self._slot)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, gemma: bool = False,
                 fp8_scale: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        what = "fused all-reduce + add + RMSNorm"
        check_input(x, self.comm.device, what)
        check_input(residual, self.comm.device, what + " (residual)")
        check_input(weight, self.comm.device, what + " (weight)")
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise InvalidInputError(f"{what}: dtype {x.dtype} is not supported (bf16, fp16)")
        if x.dim() != 2:
            raise InvalidInputError(f"{what}: x must be (tokens, hidden), got shape {tuple(x.shape)}")
        t, h = x.shape
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise InvalidInputError(f"{what}: residual {tuple(residual.shape)} {residual.dtype} does not match x "
                                    f"{tuple(x.shape)} {x.dtype}")
        if weight.shape != (h,):
            raise InvalidInputError(f"{what}: weight has shape {tuple(weight.shape)}, expected ({h},)")
        if h > self.max_hidden or t > self.max_tokens:
            raise InvalidInputError(f"{what}: ({t}, {h}) exceeds the ({self.max_tokens}, {self.max_hidden}) this "
                                    "instance was set up for")
        out_dtype = torch.float8_e4m3fn if fp8_scale is not None else x.dtype
        if fp8_scale is not None and (fp8_scale.numel() != 1 or fp8_scale.device != x.device):
            raise InvalidInputError(f"{what}: fp8_scale must be a one-element tensor on {x.device}")
        if out is None:
            out = torch.empty((t, h), dtype=out_dtype, device=x.device)
        elif out.shape != x.shape or out.dtype != out_dtype or not out.is_contiguous():
            raise InvalidInputError(f"{what}: out must be a contiguous ({t}, {h}) {out_dtype} tensor")
        self.comm.check()
        if t == 0:
            return out
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        scale = fp8_scale.float() if fp8_scale is not None else weight  # any pointer when unused
        allreduce_add_rmsnorm_kernel[(self.programs,)](
            x, residual, weight, out, scale, t, h, self.eps, bases, rank, timeout, diag, ch.flags_off, ch.epochs_off,
            ch.buffer_off, self._slot, WORLD=world, BLOCK_H=triton.next_power_of_2(h), GEMMA=gemma,
            FP8=fp8_scale is not None, num_warps=8 if h >= 4096 else 4)
        return out

    def close(self) -> None:
        self.channel.close()
