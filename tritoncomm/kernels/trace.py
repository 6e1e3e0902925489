"""Stage stamps: where a kernel's time goes, measured inside it.

``stamp(trace, slot)`` stores the calling program's global timer (ns, ``%globaltimer``: one clock
for every SM, so stamps of different programs compare) and its SM's cycle counter (``%clock64``:
finer, but only comparable within one program) as two int64 at ``trace + 2 * slot``. A kernel takes
a ``TRACE`` constexpr and calls it only where that is set, so untraced builds carry no trace code.
Stamps are plain stores with no ordering: read them after the kernel has ended. Both are 0 in the
interpreter, which has no device clock.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import INTERPRET
from .ordering import clock_ns

__all__ = ["stamp"]


@triton.jit
def _cycles():
    if INTERPRET:
        return tl.full([], 0, tl.uint64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.uint64, is_pure=False, pack=1)


@triton.jit
def stamp(trace, slot):
    """Store (global timer ns, SM cycles) of this program at ``trace + 2 * slot`` (int64 ``trace``)."""
    two = tl.arange(0, 2)
    now = tl.where(two == 0, clock_ns().to(tl.int64), _cycles().to(tl.int64))
    tl.store(trace + 2 * slot + two, now)
