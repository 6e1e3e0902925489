"""All-gather into a tensor: every rank pushes its shard into slot [my rank] of every peer's buffer,
meets them at a barrier, then copies the other shards out.

Direct form (``DIRECT``), for a registered output (``Communicator.register``/``graph_capture``):
``out_tab`` is the address of the output's table row; after an entry barrier every rank stores its
shard straight into every rank's output, and a second barrier ends the launch (no copy-out). The
entry barrier is what makes it safe: a peer may store into this rank's output only once this rank
has started the launch, i.e. once its stream is past every earlier use of that memory.

Buffers alternate by epoch parity (halves of the channel buffer, each sized for the largest
output): a rank cannot finish launch k+1 before every peer has started it, so the half it writes
for launch k+1 is never the one a peer still reads for launch k. Program ``pid`` handles blocks
``pid, pid + active, ...`` of every shard on every rank (barriers between matching programs).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import assume_multiple, barrier, epoch_commit, heap_ptr, program_epoch

__all__ = ["allgather_kernel"]


@triton.jit
def _push_shard(x_ptr, out_ptr, m, iters, pid, active, rank, table, dst_off, dst_elem, WORLD: tl.constexpr,
                BLOCK: tl.constexpr):
    """Store this program's blocks of ``x`` at ``out[rank*m:]`` and, for every peer ``s``, at byte
    ``dst_off`` + element ``dst_elem`` of the memory ``table[s]`` points to (a heap base or a
    registered output)."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    for i in range(0, iters):
        j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
        mask = j < m
        v = tl.load(x_ptr + j, mask=mask)
        for s in tl.static_range(WORLD):
            if s != rank:
                tl.store(heap_ptr(table, s, dst_off, DTYPE) + dst_elem + j, v, mask=mask)
        tl.store(out_ptr + rank * m + j, v, mask=mask)


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def allgather_kernel(x_ptr, out_ptr, m, bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off, half_bytes,
                     stride, active, out_tab=0, WORLD: tl.constexpr = 2, BLOCK: tl.constexpr = 1024,
                     MDIV: tl.constexpr = 1, DIRECT: tl.constexpr = False):
    """``out[r*m:(r+1)*m] = x`` of rank ``r``, for every rank; ``m`` is a multiple of ``MDIV``. Barrier
    slots ``pid`` and (``DIRECT``) ``pid + grid``."""
    pid = tl.program_id(0)
    m = assume_multiple(m, MDIV)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ESIZE: tl.constexpr = DTYPE.primitive_bitwidth // 8
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    if pid < active:
        iters = tl.cdiv(tl.cdiv(m, BLOCK) - pid, active)
        if DIRECT:
            barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)  # every rank has entered
            _push_shard(x_ptr, out_ptr, m, iters, pid, active, rank, out_tab.to(tl.pointer_type(tl.int64)), 0,
                        rank * m, WORLD, BLOCK)
            barrier(bases, rank, WORLD, flags_off, pid + tl.num_programs(0), e, timeout, diag)
        else:
            base = buf_off + (e & 1).to(tl.int64) * half_bytes
            _push_shard(x_ptr, out_ptr, m, iters, pid, active, rank, bases, base + rank * stride * ESIZE, 0,
                        WORLD, BLOCK)
            barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
            for i in range(0, iters):
                j = (pid + i * active) * BLOCK + tl.arange(0, BLOCK)
                mask = j < m
                for s in tl.static_range(WORLD):
                    if s != rank:
                        v = tl.load(heap_ptr(bases, rank, base + s * stride * ESIZE, DTYPE) + j, mask=mask)
                        tl.store(out_ptr + s * m + j, v, mask=mask)
    epoch_commit(epoch_ptr, e)
