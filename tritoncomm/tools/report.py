"""What the tools share: cross-rank checks and reductions of measurements, and report files.

Every function taking a ``RankContext`` is collective over its CPU group (call it on every rank).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import torch
import torch.distributed as dist

from ..launch import RankContext

__all__ = ["DTYPES", "TOL", "all_true", "device_name", "digest", "fmt", "max_over_ranks", "same_on_all_ranks",
           "write_json"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Largest error relative to max |reference| that a result may have, by dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def digest(t: torch.Tensor) -> str:
    """A digest of ``t``'s bytes (equal digests: equal bits)."""
    return hashlib.sha1(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def same_on_all_ranks(ctx: RankContext, t: torch.Tensor) -> bool:
    """Whether ``t`` has the same bytes on every rank."""
    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, digest(t), group=ctx.cpu_group)
    return all(o == out[0] for o in out)


def all_true(ctx: RankContext, ok: bool | None) -> bool:
    """True when ``ok`` is true on every rank."""
    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, bool(ok), group=ctx.cpu_group)
    return all(out)


def max_over_ranks(ctx: RankContext, values: dict[str, float | None]) -> dict[str, float | None]:
    """Each key's largest value over the ranks (None where any rank has none or NaN)."""
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, values, group=ctx.cpu_group)
    out: dict[str, float | None] = {}
    for k in values:
        vs = [g[k] for g in gathered]
        out[k] = None if any(v is None or math.isnan(v) for v in vs) else max(vs)
    return out


def device_name(ctx: RankContext) -> str:
    return torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world"


def fmt(v: float | None, spec: str = "9.1f") -> str:
    """``v`` formatted by ``spec``, or ``-`` as wide."""
    return format(v, spec) if v is not None else format("-", spec.split(".")[0].rstrip("f") or "9")


def write_json(rep: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)
