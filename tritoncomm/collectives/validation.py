"""Checks that run on the host before a collective launches, so that bad input raises on the rank
that passed it instead of leaving peers waiting."""

from __future__ import annotations

import torch

from ..errors import InvalidInputError

__all__ = ["DTYPE_NAMES", "SUPPORTED_DTYPES", "SUPPORTED_OPS", "check_input", "check_op", "check_out",
           "check_reduce_args", "overlap"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
SUPPORTED_OPS = ("sum",)
_DTYPE_SET = frozenset(SUPPORTED_DTYPES)


def check_op(op: str, what: str) -> None:
    if op not in SUPPORTED_OPS:
        raise InvalidInputError(f"{what}: op {op!r} is not supported (supported: {', '.join(SUPPORTED_OPS)})")


def check_input(x: object, device: torch.device, what: str) -> None:
    """``x`` is a contiguous tensor of a supported dtype on ``device``."""
    if not (isinstance(x, torch.Tensor) and x.dtype in _DTYPE_SET and x.device == device and x.is_contiguous()
            and not x.data_ptr() % x.element_size()):  # one test on the launch path; the reason only on failure
        _input_error(x, device, what)


def _input_error(x: object, device: torch.device, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise InvalidInputError(f"{what}: dtype {x.dtype} is not supported "
                                f"(supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)})")
    if x.device != device:
        raise InvalidInputError(f"{what}: tensor is on {x.device}, this communicator serves {device}")
    if not x.is_contiguous():
        raise InvalidInputError(f"{what}: tensor is not contiguous (shape {tuple(x.shape)}, "
                                f"stride {x.stride()}); call .contiguous() first")
    raise InvalidInputError(f"{what}: tensor data at {x.data_ptr():#x} is not aligned to its "
                            f"{x.element_size()}-byte elements")


def check_out(out: object, x: torch.Tensor, numel: int, what: str, *, may_alias: bool) -> None:
    """``out`` holds ``numel`` elements of ``x``'s dtype on its device; it may be ``x`` itself only
    when ``may_alias`` (and never overlap it partially)."""
    if isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.numel() == numel and out.is_contiguous() \
            and out.device == x.device:
        op, xp = out.data_ptr(), x.data_ptr()
        if op == xp:
            if may_alias:
                return
            raise InvalidInputError(f"{what}: out overlaps the input")
        size = x.element_size()
        if xp < op + numel * size and op < xp + x.numel() * size:
            raise InvalidInputError(f"{what}: out overlaps the input" +
                                    (" (use out=x for in-place)" if may_alias else ""))
        if not op % size:
            return
    if not isinstance(out, torch.Tensor):
        raise InvalidInputError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.numel() != numel or out.dtype != x.dtype or out.device != x.device:
        raise InvalidInputError(f"{what}: out has {out.numel()} x {out.dtype} on {out.device}, expected {numel} x "
                                f"{x.dtype} on {x.device}")
    if not out.is_contiguous():
        raise InvalidInputError(f"{what}: out is not contiguous")
    raise InvalidInputError(f"{what}: out is not aligned to its {out.element_size()}-byte elements")


def check_reduce_args(x: object, out: object, op: str, device: torch.device, max_bytes: int, what: str) -> None:
    """Raise ``InvalidInputError`` unless an all-reduce can serve ``x`` (and ``out``)."""
    check_input(x, device, what)
    check_op(op, what)
    nbytes = x.numel() * x.element_size()
    if nbytes > max_bytes:
        raise InvalidInputError(f"{what}: {nbytes} bytes exceed the {max_bytes} bytes this collective was set "
                                "up for (max_bytes at construction, bounded by the heap), and no fallback group "
                                "was given")
    if out is not None and out is not x:  # in place (the same tensor) needs no second look
        check_out(out, x, x.numel(), what, may_alias=True)
        if out.shape != x.shape:
            raise InvalidInputError(f"{what}: out shape {tuple(out.shape)} differs from input {tuple(x.shape)}")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes of ``a`` and ``b`` overlap."""
    a0, a1 = a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
    b0, b1 = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
    return a0 < b1 and b0 < a1
