"""Checks that run on the host before a collective launches, so that bad input raises on the rank
that passed it instead of leaving peers waiting."""

from __future__ import annotations

import torch

from ..errors import InvalidInputError

__all__ = ["SUPPORTED_DTYPES", "SUPPORTED_OPS", "check_reduce_args"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_OPS = ("sum",)


def check_reduce_args(x: object, out: object, op: str, device: torch.device, max_bytes: int, what: str) -> None:
    """Raise ``InvalidInputError`` unless ``x`` (and ``out``) can be served."""
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if op not in SUPPORTED_OPS:
        raise InvalidInputError(f"{what}: op {op!r} is not supported (supported: {', '.join(SUPPORTED_OPS)})")
    if x.dtype not in SUPPORTED_DTYPES:
        raise InvalidInputError(f"{what}: dtype {x.dtype} is not supported "
                                f"(supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)})")
    if x.device != device:
        raise InvalidInputError(f"{what}: tensor is on {x.device}, this communicator serves {device}")
    if not x.is_contiguous():
        raise InvalidInputError(f"{what}: tensor is not contiguous (shape {tuple(x.shape)}, "
                                f"stride {x.stride()}); call .contiguous() first")
    nbytes = x.numel() * x.element_size()
    if nbytes > max_bytes:
        raise InvalidInputError(f"{what}: {nbytes} bytes exceed the {max_bytes} bytes this all-reduce was set "
                                "up for (max_bytes at construction, bounded by the heap)")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise InvalidInputError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            raise InvalidInputError(f"{what}: out {tuple(out.shape)} {out.dtype} {out.device} does not match "
                                    f"input {tuple(x.shape)} {x.dtype} {x.device}")
        if not out.is_contiguous():
            raise InvalidInputError(f"{what}: out is not contiguous")
        if out.data_ptr() != x.data_ptr() and _overlap(x, out):
            raise InvalidInputError(f"{what}: out partially overlaps the input (use out=x for in-place)")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, a1 = a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
    b0, b1 = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
    return a0 < b1 and b0 < a1
