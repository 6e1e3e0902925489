"""How the fused all-reduce + residual + RMSNorm variants cut rows: on the host (``RowPlan``, the
same decision on every rank) and in their kernels (the ``@triton.jit`` helpers below).

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

**Batch-invariant rows** (``RowPlan.tree``, the deterministic mode). ``tl.sum``'s order follows the
block's layout and the chunk count follows the token count, so an ordinary row's fp32 sum of squares,
and so its ``rstd``, can change with the batch it sits in or the variant that serves it. With
``tree`` a row of ``H`` columns is a padded range of ``P = pow2_at_least(H)`` columns (zeros past
``H``), cut into ``CH`` chunks of ``P / CH`` columns (``CH`` a power of two), each summed as a
pairwise tree (``kernels.pairwise_sum``) and the chunks' sums added as a pairwise tree in chunk
order: always the pairwise tree of the padded row, whatever ``CH``, the block layout or the variant.
``rstd = 1 / sqrt(sum / H + eps)`` then uses correctly rounded division and square root, so the
whole row is a function of its inputs alone, which a host computes the same way
(``tests/collectives/test_determinism.py``). The variants that sum a chunk in several blocks or in
non-power-of-two groups (the two-shots) do not serve this mode.

"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from ...kernels import heap_ptr, ll8_poll_sum_f32, ll8_store, pairwise_sum, pow2_at_least, round_to
from ...units import cdiv, round_up

__all__ = ["LL2_MAX_CHUNKS", "MAX_CHUNKS", "RowPlan", "add_residual", "block_cols", "chunk_cols", "load_chunk",
           "fp8_inverse_scale", "norm_values", "row_rstd", "row_rstd_from_partial", "store_norm", "work_item"]

#: Most chunks a row is cut into (GPUs only; a power of two that divides every variant's grid).
MAX_CHUNKS = 16
#: The LL two-shot cuts a row into at most this many chunks (``NQ`` groups of ``W``).
LL2_MAX_CHUNKS = 32


@dataclass(frozen=True)
class RowPlan:
    """What the fused variants are sized for and how they cut rows into chunks.

    ``programs``: every variant's grid (the LL variant's is at most 32); ``max_chunks``: the most
    chunks per row (1 where programs run one after another, i.e. in the CPU world); ``tree``: rows
    summed as pairwise trees over power-of-two chunks (module docstring, "Batch-invariant rows")."""

    world: int
    max_tokens: int
    max_hidden: int
    programs: int
    max_chunks: int
    cuda: bool
    tree: bool = False

    def rows_for(self, nbytes: int) -> int:
        """Rows of ``max_hidden`` 16-bit columns a message of ``nbytes`` holds (at most ``max_tokens``)."""
        return min(self.max_tokens, cdiv(nbytes, 2 * self.max_hidden))

    def chunks(self, tokens: int, hidden: int, programs: int | None = None) -> tuple[int, int]:
        """``(CH, CW)`` for ``tokens`` rows per program group (all rows; a shard's for the two-shot)
        on a grid of ``programs`` (default: ``self.programs``): chunks per row and columns per chunk,
        the same on every rank. Enough items to spread a few rows over the programs but at most one
        item per program (with two, a program's second row exchange waits behind its first;
        ``docs/algorithms.md``, "Fused norm: rows in chunks"), chunks of at least 512 columns, ``CW``
        a multiple of 16. (Cutting rows, and the two-shot's column blocks, change how the sum of
        squares is grouped, so the variants agree bit for bit only where they group alike: in the CPU
        world, rows of at most ``TWOSHOT_MAX_COLS_CPU`` columns.)"""
        grid = programs or self.programs
        ch = 1
        while ch < self.max_chunks and tokens * ch * 2 <= grid and hidden // (2 * ch) >= 512:
            ch *= 2
        return ch, self.chunk_width(hidden, ch)

    def chunk_width(self, hidden: int, ch: int) -> int:
        """Columns per chunk of rows of ``hidden`` cut into ``ch`` chunks: a multiple of 16, or with
        ``tree`` the padded row's ``pow2_at_least(hidden) / ch``, at least 16 (a wider padding adds only
        zeros to the tree: the same sum)."""
        if self.tree:
            return max(pow2_at_least(hidden) // ch, 16)
        return round_up(cdiv(hidden, ch), 16)

    def ll2_shapes(self, hidden: int) -> list[tuple[int, int]]:
        """Every ``(NQ, CW)`` the LL two-shot may use for rows of ``hidden`` columns."""
        out, nq = [], 1
        while True:
            out.append((nq, round_up(cdiv(hidden, nq * self.world), 16)))
            if not self.cuda or 2 * nq * self.world > LL2_MAX_CHUNKS or 2 * nq > self.programs:
                return out
            nq *= 2

    def ll2_groups(self, tokens: int, hidden: int) -> tuple[int, int]:
        """``(NQ, CW)`` for the LL two-shot: a row is ``NQ`` groups of ``W`` chunks of ``CW`` columns
        (a multiple of 16), the same on every rank. More groups per row while the groups still fit
        in the grid and chunks keep at least 256 columns; ``NQ = 1`` in the CPU world, where
        no program may wait for another of its rank."""
        shapes = self.ll2_shapes(hidden)
        nq, cw = shapes[0]
        for n, c in shapes[1:]:
            if tokens * n > self.programs or hidden // (n * self.world) < 256:
                break
            nq, cw = n, c
        return nq, cw


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
def add_residual(acc, res, res_out_ptr, row, H, cols, cmask, ENGINE: tl.constexpr = False):
    """``acc`` is the fp32 sum over ranks of these columns of ``row`` and ``res`` the residual's
    (``load_chunk``, loaded before the wait): add in fp32, round once, store the new residual to
    ``res_out_ptr`` (which may be the residual or the input: only these columns are touched, after
    they were read). Returns it. ``ENGINE``: round the sum to the residual's dtype first, as an
    all-reduce followed by a separate add does."""
    if ENGINE:
        acc = round_to(acc, res.dtype).to(tl.float32)
    resid = round_to(acc + res.to(tl.float32), res.dtype)
    tl.store(res_out_ptr + row * H + cols, resid, mask=cmask)
    return resid


@triton.jit
def row_rstd(resid, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH: tl.constexpr,
             TREE: tl.constexpr = False):
    """``1 / sqrt(mean(row^2) + eps)`` for the whole row, given this chunk's rounded residual
    (``row_rstd_from_partial`` of its sum of squares; with ``TREE`` the chunk is the whole block, its
    sum a pairwise tree: module docstring, "Batch-invariant rows")."""
    v = resid.to(tl.float32)
    if TREE:
        part = pairwise_sum(v * v)
    else:
        part = tl.sum(v * v, axis=0)
    return row_rstd_from_partial(part, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH, TREE)


@triton.jit
def row_rstd_from_partial(part, row, c, H, eps, bases, rank, xch_off, e, timeout, diag, CH: tl.constexpr,
                          TREE: tl.constexpr = False):
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
        total = ll8_poll_sum_f32(slots + k, k < CH, e, rank, row, rank, timeout, diag, TREE)
    if TREE:  # correctly rounded: a host computes the same bits
        one = tl.full([], 1.0, tl.float32)
        return tl.math.div_rn(one, tl.math.sqrt_rn(tl.math.div_rn(total, tl.cast(H, tl.float32)) + eps))
    return 1.0 / tl.sqrt(total / H + eps)


@triton.jit
def fp8_inverse_scale(scale_ptr, FP8: tl.constexpr):
    """With ``FP8``, ``1 / scale`` rounded once (IEEE division), as vLLM's static FP8 quantisation and
    FlashInfer's fused quantisation compute it; else 1. Loaded as the kernel starts, so that the
    quantisation at its end waits for no load."""
    inv = tl.full([], 1.0, tl.float32)
    if FP8:
        inv = tl.math.div_rn(inv, tl.load(scale_ptr).to(tl.float32))
    return inv


@triton.jit
def norm_values(resid, rstd, w, GEMMA: tl.constexpr, FP8: tl.constexpr, ENGINE: tl.constexpr, inv_scale):
    """The normalised values ``resid * rstd * w`` (``1 + w`` with Gemma) in fp32, or with ``FP8`` their
    quantisation ``clamp(y * inv_scale, -448, 448)`` (still fp32, to be rounded to e4m3; ``inv_scale``
    from ``fp8_inverse_scale``). ``ENGINE``: the FP8 value is quantised from ``y`` rounded to the
    residual's dtype, as a separate quantisation of the norm's output does."""
    w = w.to(tl.float32)
    if GEMMA:
        w = w + 1.0
    y = resid.to(tl.float32) * rstd * w
    if FP8:
        if ENGINE:
            y = round_to(y, resid.dtype).to(tl.float32)
        y = tl.minimum(tl.maximum(y * inv_scale, -448.0), 448.0)
    return y


@triton.jit
def store_norm(resid, rstd, row, H, cols, cmask, w, out_ptr, inv_scale, GEMMA: tl.constexpr,
               FP8: tl.constexpr, ENGINE: tl.constexpr = False):
    """``out[row, cols] =`` ``norm_values``, rounded to ``out``'s dtype; ``w`` is the weight's chunk
    (``load_chunk``)."""
    y = norm_values(resid, rstd, w, GEMMA, FP8, ENGINE, inv_scale)
    tl.store(out_ptr + row * H + cols, round_to(y, out_ptr.dtype.element_ty), mask=cmask)
