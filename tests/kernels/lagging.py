"""A kernel whose warps run out of step: a Lamport poll by a program whose warps are late by turns
(``test_lamport``'s run on GPUs, ``test_ptx``'s count of its CTA barriers)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritoncomm.kernels import clock_ns, lamport_poll, lamport_reset, lamport_store

__all__ = ["lag_warps", "lagging_reader_kernel"]


@triton.jit
def lag_warps(like, prompt, lag_ns):
    """On GPUs, every thread outside warp ``prompt`` of the program spins ``lag_ns`` before it goes
    on: the warps of one program, out of step. 0 per element of ``like``."""
    return tl.inline_asm_elementwise(
        """{
        .reg .u32 %w;
        .reg .u64 %t0, %t1, %lim;
        .reg .pred %p;
        mov.u32 %w, %tid.x;
        shr.u32 %w, %w, 5;
        setp.eq.u32 %p, %w, $2;
        cvt.u64.u32 %lim, $3;
        selp.u64 %lim, 0, %lim, %p;
        mov.u64 %t0, %globaltimer;
        LAG${:uid}:
        mov.u64 %t1, %globaltimer;
        sub.u64 %t1, %t1, %t0;
        setp.lt.u64 %p, %t1, %lim;
        @%p bra LAG${:uid};
        mov.u32 $0, 0;
        }""", "=r,r,r,r", [like, prompt, lag_ns], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def lagging_reader_kernel(buf, out, rank, timeout, diag_addr, prompt, lag_ns, write_at_ns, SYNC: tl.constexpr,
                           BLOCK: tl.constexpr):
    """Program 1 stores ``BLOCK`` values into ``buf`` after ``write_at_ns``; program 0 polls them,
    every warp but ``prompt`` ``lag_ns`` late, resets them (``SYNC`` as given) and keeps what it
    read in ``out``. ``BLOCK`` is below the threads of the program: each element has a copy per
    warp, as a row's top-k weights do in MoE dispatch."""
    offs = tl.arange(0, BLOCK)
    if tl.program_id(0) == 1:
        t0 = clock_ns()
        while clock_ns() - t0 < write_at_ns:
            pass
        lamport_store(buf + offs, (offs + 1).to(tl.float32))
    else:
        lag = lag_warps(offs, prompt, lag_ns)
        diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
        v = lamport_poll(buf + offs + lag, offs < BLOCK, 1, 0, rank, timeout, diag)
        lamport_reset(buf + offs, SYNC=SYNC)
        tl.store(out + offs, v)
