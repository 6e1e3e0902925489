"""Rounding and sums that are the same in both worlds, and in every launch shape.

``round_to(x, DTYPE)`` narrows fp32 to ``DTYPE`` with round-to-nearest-even, as the GPU's
``cvt.rn`` and torch do. Triton 3.6's interpreter narrows fp32 to bf16 and fp8 differently (it
rounds ties away and can lose the carry into the exponent), so in the CPU world those are rounded
here with integer operations first (fp8 subnormals may still differ by one unit in the last place);
everything else uses the ordinary conversion.

``pairwise_sum(v)`` adds a power-of-two block as a pairwise tree over its index: adjacent pairs,
then adjacent pair sums, and so on. Every add has exactly two operands and fp32 addition is
commutative, so the result depends only on the values and their indices, never on how the block is
spread over threads and warps (``tl.sum``'s order follows the layout, which follows the block size,
the warps and the loads that made the block). Blocks that tile a padded power-of-two range at
power-of-two boundaries are subtrees of the range's tree, so their pairwise sums, added as a
pairwise tree in order, give the range's sum bit for bit.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import INTERPRET

__all__ = ["pairwise_sum", "round_to"]


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


@triton.constexpr_function
def _levels(n):
    return int(n).bit_length() - 1


@triton.jit
def pairwise_sum(v):
    """The sum of ``v`` (1-D, a power-of-two length, fp32) as a pairwise tree over its index (module
    docstring): the same bits in any layout."""
    LEVELS: tl.constexpr = _levels(v.shape[0])
    for _ in tl.static_range(LEVELS):
        v = tl.sum(tl.reshape(v, [v.shape[0] // 2, 2]), axis=1)
    return tl.sum(v, axis=0)
