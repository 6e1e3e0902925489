"""The baselines engines and users run instead of tritoncomm, ready to time beside it.

Each helper is set up on every rank (collective where the baseline's set-up is) and returns
callables, or says why it could not: these are benchmarks' baselines, never a code path of the
library.
"""

from __future__ import annotations

from typing import Any

import torch

from ..launch import RankContext

__all__ = ["symm_mem_ops"]


def symm_mem_ops(ctx: RankContext, n: int, dtype: torch.dtype) -> dict[str, Any]:
    """torch symmetric-memory one-shot / two-shot all-reduce callables on a fresh symmetric buffer."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = ctx.group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(name)
            except Exception:
                pass
        buf = symm_mem.empty(n, dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(buf, name)
    except Exception as e:  # not available in this torch / on this device
        return {"error": f"{type(e).__name__}: {e}"}
    ops: dict[str, Any] = {"buf": buf}
    ops["one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name)
    ops["two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", name)
    return ops
