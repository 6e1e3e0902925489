"""Which implementation the device primitives trace to.

Triton decides at decoration time whether ``@triton.jit`` functions are compiled for a GPU or run by
the CPU interpreter (``TRITON_INTERPRET=1``). The primitives read the same switch once, at import,
and branch on it with a ``tl.constexpr``: the untaken branch is never traced, so inline PTX (which
the interpreter cannot run) and interpreter-only code (which has no PTX) live side by side in one
kernel source.
"""

from __future__ import annotations

import triton.language as tl

from .. import settings

__all__ = ["INTERPRET", "MAX_WORLD", "interpreting", "program_threads"]


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter in this process."""
    return settings.triton_interprets()


#: Fixed at import, like Triton's own choice between compiling and interpreting.
INTERPRET = tl.constexpr(interpreting())

#: Largest world size the signal tables are laid out for (one NVLink node). Flag vectors have this
#: many lanes, so it must be a power of two.
MAX_WORLD = tl.constexpr(8)


@tl.core.builtin
def program_threads(_semantic=None) -> tl.constexpr:
    """The threads of one compiled program (``num_warps * 32``), a constexpr at trace time. Compiled
    code only: the interpreter, where a block is one array never copied across threads, cannot call
    it (guard with ``INTERPRET``)."""
    return tl.constexpr(_semantic.builder.options.num_warps * 32)
