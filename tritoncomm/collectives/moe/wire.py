"""How a token travels in FP8 dispatch: e4m3 values with one fp32 scale per 128 values.

``to_fp8(v)`` takes a ``[G, 128]`` block of a row (any float dtype) and returns ``(q, scale)``:
``scale = max(amax, 1e-12) / 448`` per group and ``q = round(clamp(v / scale, -448, 448))`` in e4m3,
with IEEE divisions (``div_rn``), as torch computes them (Triton's ``/`` is approximate on GPUs), a
-0.0 taken as +0.0 (``lamport_canonical``: the one-kernel dispatch sends the values as Lamport
packets, which cannot carry -0.0; every path applies the rule, so the bits do not depend on the
path). The send kernels call it once per row, for the peers and for the rank's own experts alike.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...kernels import lamport_canonical, round_to

__all__ = ["to_fp8"]


@triton.jit
def to_fp8(v):
    """``(q [G, 128] e4m3, scale [G] fp32)`` of the ``[G, 128]`` block ``v`` (see the module docstring)."""
    f = v.to(tl.float32)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(f), axis=1), 1e-12), 448.0)
    q = tl.minimum(tl.maximum(tl.math.div_rn(f, scale[:, None]), -448.0), 448.0)
    return lamport_canonical(round_to(q, tl.float8e4nv)), scale
