"""Rounding that is the same in both worlds.

``round_to(x, DTYPE)`` narrows fp32 to ``DTYPE`` with round-to-nearest-even, as the GPU's
``cvt.rn`` and torch do. Triton 3.6's interpreter narrows fp32 to bf16 and fp8 differently (it
rounds ties away and can lose the carry into the exponent), so in the CPU world those are rounded
here with integer operations first (fp8 subnormals may still differ by one unit in the last place);
everything else uses the ordinary conversion.
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
    elif INTERPRET and DTYPE == tl.float8e4nv:
        # round the fp32 mantissa to e4m3's 3 bits first (ties to even), so that the interpreter's
        # conversion has nothing left to round (it drops the carry into the exponent)
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 20) & 1) + 0x7FFFF)) & 0xFFF00000
        return bits.to(tl.float32, bitcast=True).to(DTYPE)
    else:
        return x.to(DTYPE)
