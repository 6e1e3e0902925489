"""Symmetric-heap addressing: from (peer, byte offset) to a typed pointer.

Every rank owns one heap; every rank maps every peer's heap. A kernel receives ``bases``, an int64
table in device memory whose entry ``p`` is the address at which *this* rank sees peer ``p``'s
heap (entry ``rank`` is its own). Allocations have the same offset on every rank, so an offset plus
a peer index names the same object everywhere. The table is loaded once per use; it lives in device
memory so kernels stay valid under CUDA-graph replay.

``assume_multiple`` (with its host-side partner ``pow2_divisor``) carries a size's alignment into a
kernel: Triton specialises integer arguments only on divisibility by 16, so a bound like 375000
(a multiple of 8, not 16) would make every mask ``offs < n`` vary per element and turn 16-byte
vector accesses into 2-byte ones, local *and* remote.

``next_pow2`` is the kernels' ``triton.next_power_of_2``: a constexpr function of this package's own,
because engines replace the attribute on the ``triton`` module (SGLang sets it to a plain Python
function, which Triton's compiler then refuses inside a kernel: "Unsupported function referenced").
Kernels use it, never an attribute of ``triton`` looked up at compile time.

Nothing here orders memory: these functions only compute addresses.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "address_ptr", "aligned_runs", "assume_multiple", "heap_base", "heap_ptr", "next_pow2", "pow2_at_least",
    "pow2_divisor", "translate",
]


def pow2_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): host side, a plain call."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


#: ``pow2_at_least`` for kernels (on constexprs). On the host it works too but pays Triton's wrapper
#: (it unwraps every argument on every call): launchers call ``pow2_at_least``.
next_pow2 = triton.constexpr_function(pow2_at_least)


def pow2_divisor(n: int, cap: int = 16) -> int:
    """The largest power of two, at most ``cap`` (a power of two), that divides ``n`` (host side;
    ``cap`` for 0)."""
    return min(n & -n, cap) if n else cap


@triton.jit
def assume_multiple(n, D: tl.constexpr):
    """``n`` itself, rebuilt as ``(n // D) * D`` so that the compiler knows it is a multiple of
    ``D``; the caller promises that it is (pass ``pow2_divisor(n)`` as ``D``). Masks against the
    result keep ``D``-element vector accesses."""
    if D > 1:
        return (n // D) * D
    else:
        return n


@triton.jit
def address_ptr(addr, DTYPE: tl.constexpr):
    """A pointer to ``DTYPE`` at ``addr``, an address passed as an integer kernel argument (the
    diagnostic record, a registered row, a host-mapped word). Widened to 64 bits first: Triton passes
    an integer below 2**31 as an i32, from which the interpreter makes no pointer."""
    return addr.to(tl.int64).to(tl.pointer_type(DTYPE))


@triton.jit
def aligned_runs(base, offsets, RUN: tl.constexpr, ALIGNED: tl.constexpr):
    """``base + offsets``, where ``offsets`` is a 2-D block whose rows are runs of ``RUN``
    consecutive elements, marked (with ``ALIGNED``) as runs that start on 16-byte boundaries; the
    caller promises that they do. Triton 3.7 and later can lose both facts for an address built
    from a loop's index inside a large kernel, and then store one element per thread where 16 bytes
    are due. (The sum is made here: a hint on a function's argument would mark nothing.)"""
    ptrs = base + offsets
    if ALIGNED:
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, [1, 16]), [1, RUN])
    return ptrs


@triton.jit
def heap_base(bases, peer):
    """Address (int64) at which this rank sees ``peer``'s heap; ``peer`` may be a block."""
    return tl.load(bases + peer)


@triton.jit
def heap_ptr(bases, peer, offset, DTYPE: tl.constexpr, ALIGNED: tl.constexpr = True):
    """Pointer to ``DTYPE`` at byte ``offset`` of ``peer``'s heap.

    With ``ALIGNED`` (the default) the caller promises that ``offset`` is a multiple of 16 bytes:
    the pointer is then marked 16-byte aligned, which lets loads and stores through it compile to
    16-byte vector accesses (an address loaded from a table otherwise loses all alignment facts).
    Heap allocations are 256-byte aligned, so their offsets qualify.
    """
    p = (tl.load(bases + peer) + offset).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def translate(ptr, bases, from_rank, to_rank):
    """Map a pointer into ``from_rank``'s heap (as this rank sees it) to the same object in
    ``to_rank``'s heap. The pointer's element type is kept."""
    off = ptr.to(tl.int64) - tl.load(bases + from_rank)
    return (tl.load(bases + to_rank) + off).to(ptr.dtype)
