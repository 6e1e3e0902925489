"""All-reduce + residual add + RMSNorm (+ FP8 quantisation) in one kernel: the one-shot variant, and
the row-chunk helpers that the LL (``fused_norm_ll``) and two-shot (``fused_norm_twoshot``)
variants share.

``residual[t] += sum over ranks of x[t]`` (in place, or into ``residual_out``), then
``out[t] = rmsnorm(residual[t]) * w`` (or ``* (1 + w)``, Gemma style), optionally quantised to FP8
e4m3 with a per-tensor scale.

**Rows in chunks.** A decode step has few rows (tokens), and one program per row would leave most
of the GPU idle. So every row is cut into ``CH`` chunks of ``CW`` columns and a work item is one
(row, chunk): item ``i`` is row ``i // CH``, chunk ``i % CH``; program ``pid`` takes items
``pid, pid + P, ...``. A chunk's program sums its columns over the ranks, adds the residual,
rounds once and stores the new residual; the row's sum of squares then needs every chunk: each
program writes its partial as an LL8 packet (the fp32 partial and the launch epoch in one 8-byte
store) into a per-(row, chunk) slot of this rank's heap, polls the row's ``CH`` packets for the
same epoch and adds the ``CH`` partials in chunk order, so every chunk of a row, on every rank,
computes the same ``rstd``. The packet carries its own flag, so the exchange needs no release
fence: with a release, every program would first wait for its earlier pushes over NVLink to be
acknowledged (the LL variant) before its partial could leave. The partners of an item
are handled in the same round by programs of the same launch (``P`` is a multiple of ``CH``), which
are all resident on a GPU. The CPU interpreter runs programs one after another, so there ``CH``
is 1 and no program waits for another.

Every variant loads a chunk's residual and weight before it waits for the peers' data, so those
two local reads overlap the wait instead of following it.

The one-shot variant: program ``pid`` stages its items' chunks of ``x`` in its heap (halves
alternate by epoch parity), meets the matching programs at a barrier, then sums the ranks' staged
chunks in rank order 0..W-1 in fp32 and finishes the chunk as above.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import barrier, copy_block, epoch_commit, heap_ptr, ll8_poll_sum_f32, ll8_store, program_epoch, round_to

__all__ = ["add_residual", "allreduce_add_rmsnorm_kernel", "block_cols", "chunk_cols", "load_chunk", "row_rstd",
           "row_rstd_from_partial", "store_norm", "work_item"]


@triton.jit
def work_item(pid, i, nprog, CH: tl.constexpr):
    """Program ``pid``'s ``i``-th work item as (row, chunk): item ``pid + i * nprog``."""
    item = pid + i * nprog
    return (item // CH).to(tl.int64), item % CH


@triton.jit
def chunk_cols(c, H, CW, BLOCK_C: tl.constexpr):
    """Column indices and mask of chunk ``c`` (``CW`` columns, the last one may be short or empty),
    read as one block of ``BLOCK_C >= CW`` columns."""
    return block_cols(c, 0, H, CW, BLOCK_C)


@triton.jit
def block_cols(c, b, H, CW, BLOCK_C: tl.constexpr):
    """Column indices and mask of block ``b`` (``BLOCK_C`` wide) of chunk ``c`` (``CW`` columns)."""
    j = b * BLOCK_C + tl.arange(0, BLOCK_C)
    cols = c * CW + j
    return cols, (j < CW) & (cols < H)


@triton.jit
def load_chunk(ptr, row, H, cols, cmask):
    """These columns of ``row`` of a (rows, H) tensor (0 where masked), in its dtype; ``row = 0``
    with ``H = 0`` reads a vector (the weight)."""
    return tl.load(ptr + row * H + cols, mask=cmask, other=0.0)


@triton.jit
def add_residual(acc, res, res_out_ptr, row, H, cols, cmask):
    """``acc`` is the fp32 sum over ranks of these columns of ``row`` and ``res`` the residual's
    (``load_chunk``, loaded before the wait): add in fp32, round once, store the new residual to
    ``res_out_ptr`` (which may be the residual or the input: only these columns are touched, after
    they were read). Returns it."""
    resid = round_to(acc + res.to(tl.float32), res.dtype)
    tl.store(res_out_ptr + row * H + cols, resid, mask=cmask)
    return resid


@triton.jit
def row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH: tl.constexpr):
    """``1 / sqrt(mean(row^2) + eps)`` for the whole row, given this chunk's rounded residual
    (``row_rstd_from_partial`` of its sum of squares)."""
    v = resid.to(tl.float32)
    return row_rstd_from_partial(tl.sum(v * v, axis=0), row, c, H, eps, bases, rank, xch_off, e, timeout, diag,
                                 CH)


@triton.jit
def row_rstd_from_partial(part, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH: tl.constexpr):
    """``1 / sqrt(mean(row^2) + eps)`` for the whole row, given ``part``, chunk ``c``'s fp32 sum of
    squares of its rounded residual.

    With ``CH > 1`` the chunks of the row exchange partial sums through this rank's heap at
    ``xch_off``: one LL8 packet per (row, chunk), the fp32 partial as its data word and the launch
    epoch ``e`` as its flag. A chunk stores its packet, then polls the row's ``CH`` packets until
    all carry ``e`` (``ll8_poll_sum_f32``: volatile loads, bounded; the sum comes from the look
    that saw them all) and adds the partials in one fixed order: every chunk of the row computes
    the same ``rstd``. Only the partials travel; no other write is published.
    Epochs only grow, so a stale packet never matches a later launch; a later launch rewrites a
    packet only after this kernel has ended (launches of one stream do not overlap)."""
    if CH == 1:
        total = part
    else:
        slots = heap_ptr(bases, rank, xch_off, tl.uint64) + row * CH
        ll8_store(slots + c, part.to(tl.uint32, bitcast=True), e)
        k = tl.arange(0, CH)
        total = ll8_poll_sum_f32(slots + k, k < CH, e, rank, row, rank, timeout, diag)
    return 1.0 / tl.sqrt(total / H + eps)


@triton.jit
def store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, scale_ptr, GEMMA: tl.constexpr,
               FP8: tl.constexpr):
    """``out[row, cols] = resid * rstd * w`` (``1 + w`` with Gemma), or its FP8 quantisation
    ``clamp(y / scale, -448, 448)``; ``w`` is the weight's chunk (``load_chunk``)."""
    w = w.to(tl.float32)
    if GEMMA:
        w = w + 1.0
    y = resid.to(tl.float32) * rstd * w
    if FP8:
        q = tl.minimum(tl.maximum(y / tl.load(scale_ptr), -448.0), 448.0)
        tl.store(out_ptr + row * H + cols, round_to(q, out_ptr.dtype.element_ty), mask=cmask)
    else:
        tl.store(out_ptr + row * H + cols, round_to(y, resid.dtype), mask=cmask)


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, CW, eps,
                                 bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off, slot_bytes, xch_off,
                                 WORLD: tl.constexpr, CH: tl.constexpr, BLOCK_C: tl.constexpr, GEMMA: tl.constexpr,
                                 FP8: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    stage_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    iters = tl.cdiv(T * CH - pid, nprog)
    mine = heap_ptr(bases, rank, stage_off, DTYPE)
    for i in range(0, iters):  # 1. stage my items' chunks
        row, c = work_item(pid, i, nprog, CH)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        copy_block(mine + row * H, x_ptr + row * H, cols, cmask)
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    for i in range(0, iters):  # 2. sum the chunks over ranks, add, normalise
        row, c = work_item(pid, i, nprog, CH)
        cols, cmask = chunk_cols(c, H, CW, BLOCK_C)
        res = load_chunk(res_ptr, row, H, cols, cmask)
        w = load_chunk(w_ptr, 0, 0, cols, cmask)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for s in tl.static_range(WORLD):
            acc += tl.load(heap_ptr(bases, s, stage_off, DTYPE) + row * H + cols, mask=cmask,
                           other=0.0).to(tl.float32)
        resid = add_residual(acc, res, res_out_ptr, row, H, cols, cmask)
        rstd = row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH)
        store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, scale_ptr, GEMMA, FP8)
    epoch_commit(epoch_ptr, e)
