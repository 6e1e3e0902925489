"""Memory-ordering building blocks: acquire loads, release stores, fences and the clock.

These are the only places where the GPU and interpreter implementations differ. On the GPU they
are single PTX instructions at *system* scope (``.sys``), so the ordering holds between GPUs over
NVLink and towards the host. In the CPU world they are real atomics on the raw addresses (the
interpreter implements them with C++ atomics on shared memory mapped by every rank process).

All operate elementwise on blocks of pointers; each lane is one independent access.

Contracts (per lane):

* ``ld_acquire(p)``: a load-acquire. Writes that the writer ordered before its release of the
  value read here are visible to *this thread* afterwards. Other threads of the program need a
  CTA barrier (``tl.debug_barrier()``) after it before they rely on that.
* ``st_release(p, v)``: a store-release. Every write made by *this thread* before it is visible to
  any thread that reads ``v`` with an acquire. To publish writes of other threads of the program,
  put a CTA barrier before it (``signals.signal`` does this).
* ``ld_volatile(p)``: a relaxed load that is never cached or hoisted out of a loop; no ordering.
* ``st_relaxed(p, v)``: a relaxed system-scope store; no ordering.
* ``fence_sys()``: a full acquire-release fence at system scope for this thread.
* ``clock_ns()``: nanoseconds: ``%globaltimer`` on the GPU, the host's monotonic clock in the
  interpreter, so that every bounded wait measures wall-clock time in both worlds.

Programmatic dependent launch (Hopper; a kernel launched with ``launch_pdl=True`` may start before the
previous kernel on its stream has ended):

* ``pdl_wait()``: returns once the previous kernel on the stream has completed and its memory
  operations are visible. A kernel launched with ``launch_pdl=True`` calls it before its first access
  to memory that an earlier kernel may write (its inputs, its epochs, its buffers); after it, ordering
  is as between ordinary back-to-back launches.
* ``pdl_launch_dependents()``: lets the next kernel on the stream, if launched with ``launch_pdl``,
  start once every program of this one has called it or ended (its ``pdl_wait`` still waits for this
  kernel to end). Publishes nothing.

Both are no-ops without PDL and in the interpreter.
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from .backend import INTERPRET

__all__ = ["clock_ns", "fence_sys", "ld_acquire", "ld_acquire_first_warp", "ld_volatile", "pdl_launch_dependents",
           "pdl_wait", "st_relaxed", "st_release", "st_release_first_warp"]


@triton.jit
def ld_acquire(ptrs):
    """Load-acquire of 32-bit words at system scope (see module docstring)."""
    if INTERPRET:
        return tl.atomic_or(ptrs, 0, sem="acquire", scope="sys")
    else:
        return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptrs],
                                         dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def ld_acquire_first_warp(ptrs, otherwise):
    """``ld_acquire`` by the program's first warp (threads 0-31) only; every other thread returns
    ``otherwise`` without touching memory. For blocks whose lanes all live in the first warp (at
    most 32 lanes); the other warps need a CTA barrier after the first warp's acquire. In the
    interpreter (one thread per program) it is ``ld_acquire``."""
    if INTERPRET:
        return ld_acquire(ptrs)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.lt.u32 p, t, 32; mov.b32 $0, $2; "
            "@p ld.acquire.sys.global.b32 $0, [$1]; }", "=r,l,r", [ptrs, tl.cast(otherwise, tl.uint32)],
            dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def st_release_first_warp(ptrs, values):
    """``st_release`` by the program's first warp only (the others store nothing): after a CTA
    barrier it publishes the writes of every thread of the program (the barrier orders them before
    the first warp's release). In the interpreter it is ``st_release``."""
    values = tl.cast(values, tl.uint32)
    if INTERPRET:
        tl.atomic_xchg(ptrs, values, sem="release", scope="sys")
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.lt.u32 p, t, 32; "
            "@p st.release.sys.global.b32 [$1], $2; mov.u32 $0, 0; }", "=r,l,r", [ptrs, values],
            dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def st_release(ptrs, values):
    """Store-release of 32-bit words at system scope (see module docstring).

    Idempotent stores only: on the GPU a lane may be executed by several threads that hold a
    replicated copy of it, so the same value can be stored more than once.
    """
    values = tl.cast(values, tl.uint32)
    if INTERPRET:
        tl.atomic_xchg(ptrs, values, sem="release", scope="sys")
    else:
        tl.inline_asm_elementwise("st.release.sys.global.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                  [ptrs, values], dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def st_relaxed(ptrs, values):
    """Relaxed system-scope store of 32-bit words; no ordering with other accesses."""
    values = tl.cast(values, tl.uint32)
    if INTERPRET:
        tl.atomic_xchg(ptrs, values, sem="relaxed", scope="sys")
    else:
        tl.inline_asm_elementwise("st.relaxed.sys.global.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                  [ptrs, values], dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def ld_volatile(ptrs, mask=None):
    """Relaxed load that is re-issued every time (never cached in registers or hoisted)."""
    return tl.load(ptrs, mask=mask, volatile=True)


@triton.jit
def fence_sys():
    """Acquire-release fence at system scope for the calling thread."""
    if INTERPRET:
        pass
    else:
        tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.uint32,
                                  is_pure=False, pack=1)


def _host_ns(*args: object, **kwargs: object) -> int:
    """The host's monotonic clock (ns), read by ``clock_ns`` in the interpreter. Marked a builtin so
    that Triton's compiler, which never traces the interpreter's branch, accepts the reference."""
    return time.monotonic_ns()


_host_ns.__triton_builtin__ = True  # type: ignore[attr-defined]


@triton.jit
def clock_ns():
    """Nanoseconds: the GPU's global timer, or the host's monotonic clock in the interpreter."""
    if INTERPRET:
        return tl.full([], _host_ns(), tl.uint64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64,
                                         is_pure=False, pack=1)


@triton.jit
def pdl_wait():
    """Wait for the previous kernel on the stream to complete (see the module docstring)."""
    if INTERPRET:
        pass
    else:
        tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=tl.uint32, is_pure=False,
                                  pack=1)


@triton.jit
def pdl_launch_dependents():
    """Allow the next PDL kernel on the stream to start early (see the module docstring)."""
    if INTERPRET:
        pass
    else:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], dtype=tl.uint32,
                                  is_pure=False, pack=1)
