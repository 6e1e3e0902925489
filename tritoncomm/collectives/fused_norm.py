"""All-reduce + residual add + RMSNorm (+ FP8 quantisation) in one kernel: the one-shot variant, and
the row helpers the LL (``fused_norm_ll``) and two-shot (``fused_norm_twoshot``) variants share.

``residual[t] += sum over ranks of x[t]`` (in place), then ``out[t] = rmsnorm(residual[t]) * w``
(or ``* (1 + w)``, Gemma style), optionally quantised to FP8 e4m3 with a per-tensor scale.

It is the one-shot all-reduce with the normalisation fused into its read phase: program ``pid``
stages rows ``pid, pid + P, ...`` of ``x`` in its heap (halves alternate by epoch parity), meets the
matching programs at a barrier, then for each of its rows sums the ranks' staged rows in rank order
in fp32, adds the residual, rounds the new residual to its dtype and stores it, and normalises that
rounded residual (as the engines' fused add-RMSNorm does). One row per step: hidden <= BLOCK_H.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import barrier, copy_block, epoch_commit, heap_ptr, program_epoch, round_to

__all__ = ["add_norm_row", "allreduce_add_rmsnorm_kernel", "load_weight", "norm_row"]


@triton.jit
def norm_row(resid, row, H, cols, cmask, w, out_ptr, scale_ptr, eps, FP8: tl.constexpr):
    """``out[row] = rmsnorm(resid) * w`` (``w`` already fp32, Gemma's ``+1`` applied), optionally
    quantised to FP8 with the per-tensor scale at ``scale_ptr``. ``resid`` is the rounded residual."""
    v = resid.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / H + eps)
    y = v * rstd * w
    if FP8:
        q = tl.minimum(tl.maximum(y / tl.load(scale_ptr), -448.0), 448.0)
        tl.store(out_ptr + row * H + cols, round_to(q, out_ptr.dtype.element_ty), mask=cmask)
    else:
        tl.store(out_ptr + row * H + cols, round_to(y, resid.dtype), mask=cmask)


@triton.jit
def add_norm_row(acc, res_ptr, res_out_ptr, row, H, cols, cmask, w, out_ptr, scale_ptr, eps, FP8: tl.constexpr):
    """Given ``acc``, the fp32 sum over ranks of row ``row``: add the residual (from ``res_ptr``) in
    fp32, round once, store the new residual (to ``res_out_ptr``, which may be ``res_ptr`` or the
    input) and normalise it (``norm_row``). Returns the new residual row."""
    acc += tl.load(res_ptr + row * H + cols, mask=cmask, other=0.0).to(tl.float32)
    resid = round_to(acc, res_ptr.dtype.element_ty)
    tl.store(res_out_ptr + row * H + cols, resid, mask=cmask)
    norm_row(resid, row, H, cols, cmask, w, out_ptr, scale_ptr, eps, FP8)
    return resid


@triton.jit
def load_weight(w_ptr, cols, cmask, GEMMA: tl.constexpr):
    """The norm weight in fp32, with Gemma's ``1 + w`` applied."""
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    return w


@triton.jit
def allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, res_out_ptr, w_ptr, out_ptr, scale_ptr, T, H, eps,
                                 bases, rank, timeout, diag_addr, flags_off, epochs_off, buf_off, slot_bytes,
                                 WORLD: tl.constexpr, BLOCK_H: tl.constexpr, GEMMA: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    diag = diag_addr.to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    stage_off = buf_off + (e & 1).to(tl.int64) * slot_bytes
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    iters = tl.cdiv(T - pid, nprog)
    mine = heap_ptr(bases, rank, stage_off, DTYPE, False)
    for i in range(0, iters):
        row = (pid + i * nprog).to(tl.int64)
        copy_block(mine + row * H, x_ptr + row * H, cols, cmask)
    barrier(bases, rank, WORLD, flags_off, pid, e, timeout, diag)
    w = load_weight(w_ptr, cols, cmask, GEMMA)
    for i in range(0, iters):
        row = (pid + i * nprog).to(tl.int64)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for s in tl.static_range(WORLD):
            acc += tl.load(heap_ptr(bases, s, stage_off, DTYPE, False) + row * H + cols, mask=cmask,
                           other=0.0).to(tl.float32)
        add_norm_row(acc, res_ptr, res_out_ptr, row, H, cols, cmask, w, out_ptr, scale_ptr, eps, FP8)
    epoch_commit(epoch_ptr, e)
