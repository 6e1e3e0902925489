"""The batch-invariant add + RMSNorm of rows already all-reduced, on this rank alone: what the engines'
deterministic modes run where the fused kernel does not serve a batch (more rows than it was set up
for), with the same bits the fused kernel's batch-invariant rows have (``rows.py``, "Batch-invariant
rows", with the engine's rounding: the sum is rounded to the dtype before the residual is added). One
program per row; the sum of squares is the padded row's pairwise tree, whatever the block."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import InvalidInputError
from ...kernels import pow2_at_least
from .rows import add_residual, fp8_inverse_scale, load_chunk, row_rstd, store_norm

__all__ = ["invariant_add_rms_norm", "invariant_add_rmsnorm_kernel"]


@triton.jit(do_not_specialize=["H"])
def invariant_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, H, eps,
                                 BLOCK: tl.constexpr, GEMMA: tl.constexpr, FP8: tl.constexpr):
    """Row ``program_id``: ``res_out = round(x + res)`` (fp32 add), ``out = rmsnorm(res_out) * w`` as the
    fused kernel's batch-invariant rows compute it (``BLOCK``: the padded row, a power of two)."""
    row = tl.program_id(0).to(tl.int64)
    inv_scale = fp8_inverse_scale(scale_ptr, FP8)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    x = load_chunk(x_ptr, row, H, cols, cmask).to(tl.float32)
    res = load_chunk(res_ptr, row, H, cols, cmask)
    w = load_chunk(w_ptr, 0, 0, cols, cmask)
    resid = add_residual(x, res, res_out_ptr, row, H, cols, cmask, True)
    rstd = row_rstd(resid, row, 0, H, eps, 0, 0, 0, 0, 0, 0, 1, True)  # one chunk: no exchange
    store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA, FP8, True)


def invariant_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                           fp8_scale: torch.Tensor | None = None, gemma: bool = False,
                           out: torch.Tensor | None = None,
                           residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm, residual + x)`` for ``x`` (tokens, hidden) already all-reduced (bf16/fp16,
    contiguous, as ``residual``); ``norm`` is FP8 e4m3 given ``fp8_scale``. The bits of
    ``FusedAllReduceAddRMSNorm(rounding="engine", batch_invariant=True)`` for the same rows."""
    if x.dim() != 2 or residual.shape != x.shape or residual.dtype != x.dtype or weight.shape != (x.shape[1],) \
            or x.dtype not in (torch.bfloat16, torch.float16) \
            or not (x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        raise InvalidInputError(f"invariant add + RMSNorm: x and residual must be contiguous (tokens, hidden) "
                                f"bf16/fp16 of one shape, weight (hidden,); got {tuple(x.shape)} {x.dtype}, "
                                f"{tuple(residual.shape)} {residual.dtype}, {tuple(weight.shape)}")
    t, h = x.shape
    if out is None:
        out = torch.empty_like(x, dtype=torch.float8_e4m3fn if fp8_scale is not None else x.dtype)
    if residual_out is None:
        residual_out = torch.empty_like(residual)
    if t:
        block = pow2_at_least(h)
        invariant_add_rmsnorm_kernel[(t,)](x, residual, residual_out, weight, out,
                                           fp8_scale if fp8_scale is not None else weight, h, eps, BLOCK=block,
                                           GEMMA=gemma, FP8=fp8_scale is not None,
                                           num_warps=max(1, min(16, block // 512)))
    return out, residual_out
