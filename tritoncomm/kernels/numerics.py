"""Rounding that is the same in both worlds.

``round_to(x, DTYPE)`` narrows fp32 to ``DTYPE`` with round-to-nearest-even, as the GPU's
``cvt.rn`` and torch do. Triton 3.6's interpreter narrows fp32 to bf16 differently (it rounds ties
away and can lose the carry into the exponent), so in the CPU world bf16 is rounded here with
integer operations instead; everything else uses the ordinary conversion.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import INTERPRET

__all__ = ["round_to"]


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """``x`` (fp32) rounded to ``DTYPE`` (nearest, ties to even)."""
    if INTERPRET and DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        rounded = tl.where(x != x, 0x7FC0, rounded)  # NaN stays a (quiet) NaN
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)
