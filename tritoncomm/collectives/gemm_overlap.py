"""Row-parallel GEMM + all-reduce in one persistent kernel: tiles are reduced while others are computed.

``out = sum over ranks of (a @ w.T)`` for ``a`` (M x K, this rank's slice of the input features)
and ``w`` (N x K, this rank's slice of the weight's columns), as a row-parallel linear layer needs.

The grid has two roles, split by program id:

* **Workers** (programs ``0 .. G-1``) are a persistent GEMM: worker ``g`` computes tiles
  ``g, g + G, ...`` (grouped order, ``BM x BN`` each, fp32 accumulation), rounds each tile to the
  input dtype, stores it into this rank's heap (local memory, fast) and then ``barrier_arrive``s on
  the tile's slot: a release that publishes the tile, and the tile's epoch stored into lane [my
  rank] of that slot in every rank's flag table. Workers never wait, so they finish whatever else
  runs on the GPU.
* **Reducers** (programs ``G .. G+R-1``) take tiles ``j, j + R, ...``, in the order workers make
  them: ``barrier_wait`` until every rank has published the tile (acquire), then pull the tile from
  every rank's heap (NVLink reads; its own locally), sum in rank order 0..W-1 in fp32 and write the
  rounded sum to ``out``. Every rank runs the same sums in the same order: the same bits everywhere.

So the pulls of finished tiles overlap the products of the next ones. Nothing needs the two roles
to be resident together: only reducers wait, and only for workers. In the CPU world the interpreter
runs the workers first, then the reducers, which is one valid schedule.

Every program keeps an epoch (one per launch, so all agree). Tile buffers alternate by epoch parity:
a rank's workers of launch k+2 overwrite the buffer of launch k only after its reducers of launch
k+1 saw every peer's tiles of k+1, which every peer made after its launch k, reads included, ended.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import INTERPRET, barrier_arrive, barrier_wait, epoch_commit, heap_ptr, program_epoch, round_to

__all__ = ["gemm_allreduce_kernel", "tile_coords"]


@triton.jit
def tile_coords(t, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of tile ``t`` in grouped order (``GROUP_M`` row blocks share columns,
    so neighbouring tiles reuse operands in L2)."""
    pm = tl.cdiv(M, BM)
    pn = tl.cdiv(N, BN)
    per_group = GROUP_M * pn
    first = (t // per_group) * GROUP_M
    size = tl.minimum(pm - first, GROUP_M)
    return first + (t % per_group) % size, (t % per_group) // size


@triton.jit
def _gemm_tile(a_ptr, w_ptr, M, N, K, bm, bn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               EVEN_K: tl.constexpr):
    """One ``BM x BN`` tile of ``a @ w.T`` in fp32 (rows/columns past M/N read as zero)."""
    rm = bm * BM + tl.arange(0, BM)
    rn = bn * BN + tl.arange(0, BN)
    ra = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)  # wrapped rows: loads need no mask
    rb = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + ra[:, None].to(tl.int64) * K + rk[None, :]
    b_ptrs = w_ptr + rb[None, :].to(tl.int64) * K + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BK, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BK, other=0.0)
        if INTERPRET:  # the interpreter's bf16 dot multiplies raw bits; fp32 products of bf16 are exact
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    return acc


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def gemm_allreduce_kernel(a_ptr, w_ptr, out_ptr, M, N, K, bases, rank, timeout, diag_addr, flags_off, epochs_off,
                          buf_off, slot_bytes, WORKERS, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, GROUP_M: tl.constexpr, RB: tl.constexpr, EVEN_K: tl.constexpr):
    """Grid: ``WORKERS`` worker programs then the reducers. Barrier slot ``t`` is tile ``t``'s."""
    pid = tl.program_id(0)
    DTYPE: tl.constexpr = a_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    tiles_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    ntiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    if pid < WORKERS:
        mine = heap_ptr(bases, rank, tiles_off, DTYPE)
        for t in range(pid, ntiles, WORKERS):
            bm, bn = tile_coords(t, M, N, BM, BN, GROUP_M)
            acc = _gemm_tile(a_ptr, w_ptr, M, N, K, bm, bn, BM, BN, BK, EVEN_K)
            rm = (bm * BM + tl.arange(0, BM)).to(tl.int64)
            rn = bn * BN + tl.arange(0, BN)
            tl.store(mine + rm[:, None] * N + rn[None, :], round_to(acc, DTYPE),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))
            barrier_arrive(bases, rank, WORLD, flags_off, t, e)
    else:
        reducers = tl.num_programs(0) - WORKERS
        for t in range(pid - WORKERS, ntiles, reducers):
            barrier_wait(bases, rank, WORLD, flags_off, t, e, timeout, diag)
            bm, bn = tile_coords(t, M, N, BM, BN, GROUP_M)
            rn = bn * BN + tl.arange(0, BN)
            for r0 in range(0, BM, RB):
                rm = (bm * BM + r0 + tl.arange(0, RB)).to(tl.int64)
                offs = rm[:, None] * N + rn[None, :]
                m = (rm[:, None] < M) & (rn[None, :] < N)
                acc = tl.zeros((RB, BN), dtype=tl.float32)
                for s in tl.static_range(WORLD):
                    acc += tl.load(heap_ptr(bases, s, tiles_off, DTYPE) + offs, mask=m).to(tl.float32)
                tl.store(out_ptr + offs, round_to(acc, DTYPE), mask=m)
    epoch_commit(epoch_ptr, e)
