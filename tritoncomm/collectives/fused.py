"""Fused tensor-parallel epilogue: all-reduce + residual add + RMSNorm (+ FP8), host side.

Four kernels, one per all-reduce shape: LL packets (``fused_norm_ll``), the LL two-shot
(``fused_norm_ll_twoshot``), the one-shot (``fused_norm``) and the two-shot by rows
(``fused_norm_twoshot``), picked by bytes from ``MEASURED_SELECTION`` on GPUs at TP2/TP4, else as the
all-reduce table picks for the same bytes. All of them sum the ranks in order 0..W-1 in fp32, add the
residual in fp32 and round once, so they give the same bits on every rank.
"""

from __future__ import annotations

import torch
import triton

from ..channels import Communicator
from ..errors import InvalidInputError
from .allreduce import LL_MAX_BYTES, LL_TWOSHOT_MAX_BYTES
from .common import CollectiveBase, round_up
from .fused_norm import allreduce_add_rmsnorm_kernel
from .fused_norm_ll import ll_allreduce_add_rmsnorm_kernel
from .fused_norm_ll_twoshot import ll_twoshot_allreduce_add_rmsnorm_kernel
from .fused_norm_twoshot import twoshot_allreduce_add_rmsnorm_kernel
from .tuning import SelectionTable
from .validation import DTYPE_NAMES, _overlap, check_input

__all__ = ["FUSED_ALGOS", "MAX_HIDDEN", "FusedAllReduceAddRMSNorm"]

#: Largest hidden size served.
MAX_HIDDEN = 16384
#: Most chunks a row is cut into (GPUs only; a power of two that divides every variant's grid).
MAX_CHUNKS = 16
FUSED_ALGOS = ("ll", "oneshot", "twoshot", "ll_twoshot")
#: The LL two-shot cuts a row into at most this many chunks (``NQ`` groups of ``W``).
LL2_MAX_CHUNKS = 32
#: The two-shot walks a chunk in column blocks of at most this many columns (GPUs), so its 2-D
#: accesses (a block of W rows) stay in registers; the CPU world uses smaller blocks so that its
#: tests walk several.
TWOSHOT_MAX_COLS = 2048
TWOSHOT_MAX_COLS_CPU = 1024
_FROM_TABLE = {"ll": "ll", "ll_twoshot": "ll_twoshot", "oneshot": "oneshot", "twoshot": "twoshot",
               "pipelined": "twoshot"}

#: Variant by bytes (``tokens x hidden x 2``), per world size, measured on H200 (hidden 8192, every
#: variant timed in one run; ``benchmarks/results/fused-h200-tp{2,4}.json``): rows of
#: ``(max_bytes, variant)``, the last serving everything larger. Used on GPUs; elsewhere, and for
#: other world sizes, the all-reduce table's choice for the same bytes.
MEASURED_SELECTION: dict[int, tuple[tuple[int, str], ...]] = {
    # TP2, 2048 tokens (32 MB): one-shot 132.9 µs, two-shot 203.6 (session 5, 2026-11-21). 8 tokens
    # (128 KB): LL 5.81 µs, one-shot 6.29, LL two-shot 7.18 (session 8, 2xH200, after the LL variant
    # took one item per program; session 7 on 4xH200 had the LL two-shot at 5.94 and the LL, then
    # two items per program, at 7.37); 32 tokens: one-shot 7.78-8.14, LL 9.7-10.0, LL two-shot 9.4-11.8.
    # At TP4 the LL two-shot tied at 8 tokens (7.05 vs 6.97) and lost at 32 (session 7).
    2: ((128 << 10, "ll"), (32 << 20, "oneshot"), (1 << 62, "twoshot")),
    4: ((16 << 10, "ll"), (512 << 10, "oneshot"), (1 << 62, "twoshot")),
}


class FusedAllReduceAddRMSNorm(CollectiveBase):
    """``residual += all_reduce(x)`` in place; returns ``rmsnorm(residual) * weight`` (or
    ``* (1 + weight)`` with ``gemma=True``), in ``x``'s dtype or, given ``fp8_scale``, FP8 e4m3
    (``clamp(y / scale, -448, 448)``).

    Args:
        comm: the communicator.
        max_tokens, max_hidden: the largest ``x`` (tokens x hidden) served; ``max_hidden <= 16384``.
        eps: the RMSNorm epsilon.
        table: the all-reduce table; it picks the variant by bytes where ``MEASURED_SELECTION`` does
            not (the CPU world, other world sizes).
        algos: the variants to set up, each for every size up to the largest input (default: those
            the selection uses, each sized for what it serves).
        programs: the (fixed) grid of every variant.
        max_chunks: cut rows into at most this many chunks (GPUs; default 16, see ``chunks``).

    Inputs are bf16 or fp16, contiguous, ``(tokens, hidden)``; ``residual`` must be equal on every
    rank (as in a tensor-parallel model). Every rank gets the same bits. Collective to create and
    close; one instance per stream.
    """

    op = "allreduce"
    debug_op = "fused_add_rmsnorm"

    def __init__(self, comm: Communicator, max_tokens: int, max_hidden: int, *, eps: float = 1e-6,
                 table: SelectionTable | None = None, algos: tuple[str, ...] | None = None,
                 programs: int | None = None, max_chunks: int | None = None,
                 name: str = "fused_add_rmsnorm") -> None:
        if not 0 < max_hidden <= MAX_HIDDEN:
            raise InvalidInputError(f"max_hidden must be in 1..{MAX_HIDDEN}, got {max_hidden}")
        if max_tokens <= 0:
            raise InvalidInputError(f"max_tokens must be positive, got {max_tokens}")
        if algos is not None and any(a not in FUSED_ALGOS for a in algos):
            raise InvalidInputError(f"unknown fused variant in {algos}; known: {FUSED_ALGOS}")
        super().__init__(comm, table=table, fallback_group=None, name=name)
        self.max_tokens, self.max_hidden, self.eps = max_tokens, max_hidden, eps
        self.max_bytes = max_tokens * max_hidden * 2
        caps: dict[str, int] = {}
        self.selection = MEASURED_SELECTION.get(comm.world) if comm.backend == "cuda" else None
        if self.selection is not None and algos is None:
            lo = 0
            for hi, a in self.selection:
                if lo < self.max_bytes:
                    caps[a] = max(caps.get(a, 0), min(hi, self.max_bytes))
                lo = hi
        else:
            for a, c in self._capacities(self.max_bytes, algos).items():
                caps[_FROM_TABLE[a]] = max(caps.get(_FROM_TABLE[a], 0), c)
        if "ll" in caps:
            caps["ll"] = min(caps["ll"], LL_MAX_BYTES)
        if "ll_twoshot" in caps:
            caps["ll_twoshot"] = min(caps["ll_twoshot"], LL_TWOSHOT_MAX_BYTES)
        self.capacity = caps
        p = programs or (64 if comm.backend == "cuda" else 2)
        self._programs = p
        # rows are cut into chunks only where programs run concurrently (see fused_norm)
        self.max_chunks = min(max_chunks or MAX_CHUNKS, MAX_CHUNKS, p) if comm.backend == "cuda" else 1
        w, h = self.world, max_hidden
        xch = round_up(max_tokens * self.max_chunks * 8, 256)  # per variant: epochs differ between channels
        self._xch: dict[str, int] = {}
        if "ll" in caps:
            rows = min(max_tokens, -(-caps["ll"] // (2 * h)))
            self._ll_slot_words = round_up(rows * ((h + 1) // 2), 32)
            self._xch["ll"] = 2 * w * self._ll_slot_words * 8
            self._add_channel("ll", programs=min(p, 32), barrier_slots=0, buffer_bytes=self._xch["ll"] + xch)
        if "ll_twoshot" in caps:
            rows = min(max_tokens, -(-caps["ll_twoshot"] // (2 * h)))
            # words per (parity, source) slot: every group of the largest input, at any NQ it may use
            self._ll2_slot_words = round_up(max(rows * nq * (cw // 2) for nq, cw in self._ll2_shapes(h)), 16)
            half = 2 * w * self._ll2_slot_words * 8
            self._xch["ll_twoshot"] = 2 * half + 256  # rs, ag, tokens; then the row exchange
            self._add_channel("ll_twoshot", programs=p, barrier_slots=0,
                              buffer_bytes=self._xch["ll_twoshot"] + round_up(rows * max(LL2_MAX_CHUNKS, w) * 8, 256))
            off = self._channels["ll_twoshot"].buffer_off
            self._ll2_offs = (off, off + half, off + 2 * half)  # rs, ag, tokens
        if "oneshot" in caps:
            rows = min(max_tokens, -(-caps["oneshot"] // (2 * h)))
            self._stage_bytes = round_up(rows * h * 2, 256)
            self._xch["oneshot"] = 2 * self._stage_bytes
            self._add_channel("oneshot", programs=p, barrier_slots=p, buffer_bytes=self._xch["oneshot"] + xch)
        if "twoshot" in caps:
            rows = min(max_tokens, -(-caps["twoshot"] // (2 * h)))
            self._shard_bytes = round_up(-(-rows // w) * h * 2, 256)
            self._rstd_slot = round_up(-(-rows // w) * 4, 256)
            self._xch["twoshot"] = 2 * w * self._shard_bytes + w * self._rstd_slot
            self._add_channel("twoshot", programs=p, barrier_slots=2 * p,
                              buffer_bytes=self._xch["twoshot"] + xch)
        comm.bootstrap.barrier()

    def chunks(self, tokens: int, hidden: int, programs: int | None = None) -> tuple[int, int]:
        """``(CH, CW)`` for ``tokens`` rows per program group (all rows; a shard's for the two-shot)
        on a grid of ``programs`` (default: the instance's): chunks per row and columns per chunk,
        the same on every rank. Enough items to spread a few rows over the programs but at most one
        item per program (with two, a program's second row exchange waits behind its first: 8
        tokens on the LL variant's 32 programs took 7.3-7.4 µs in 8 chunks and 6.3-6.4 in 4; 2xH200,
        2026-11-22), chunks of at least 512 columns, ``CW`` a multiple of 16. (Cutting rows, and the
        two-shot's column blocks, change how the sum of squares is grouped, so the variants agree
        bit for bit only where they group alike: in the CPU world, rows of at most
        ``TWOSHOT_MAX_COLS_CPU`` columns.)"""
        grid = programs or self._programs
        ch = 1
        while ch < self.max_chunks and tokens * ch * 2 <= grid and hidden // (2 * ch) >= 512:
            ch *= 2
        return ch, round_up(-(-hidden // ch), 16)

    def _ll2_shapes(self, hidden: int) -> list[tuple[int, int]]:
        """Every ``(NQ, CW)`` the LL two-shot may use for rows of ``hidden`` columns."""
        out, nq = [], 1
        while True:
            out.append((nq, round_up(-(-hidden // (nq * self.world)), 16)))
            if self.comm.backend != "cuda" or 2 * nq * self.world > LL2_MAX_CHUNKS or 2 * nq > self._programs:
                return out
            nq *= 2

    def ll2_groups(self, tokens: int, hidden: int) -> tuple[int, int]:
        """``(NQ, CW)`` for the LL two-shot: a row is ``NQ`` groups of ``W`` chunks of ``CW`` columns
        (a multiple of 16), the same on every rank. More groups per row while the groups still fit
        in the grid and chunks keep at least 256 columns; ``NQ = 1`` in the CPU world, where
        no program may wait for another of its rank."""
        shapes = self._ll2_shapes(hidden)
        nq, cw = shapes[0]
        for n, c in shapes[1:]:
            if tokens * n > self._programs or hidden // (n * self.world) < 256:
                break
            nq, cw = n, c
        return nq, cw

    def select(self, tokens: int, hidden: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """The variant for ``(tokens, hidden)`` (the same on every rank)."""
        nbytes = tokens * hidden * 2
        if self.selection is not None:
            algo = next(a for hi, a in self.selection if nbytes <= hi)
        else:
            algo = _FROM_TABLE[self.table.lookup(self.op, self.world, DTYPE_NAMES[dtype], nbytes).algo]
        if algo not in self._channels or nbytes > self.capacity[algo]:
            algo = next(a for a in FUSED_ALGOS if a in self._channels and nbytes <= self.capacity[a])
        return algo

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, gemma: bool = False,
                 fp8_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 residual_out: torch.Tensor | None = None, algo: str | None = None) -> torch.Tensor:
        """Run it. ``residual_out`` (default ``residual``: in place) receives the new residual; it may
        be ``residual`` or ``x`` itself, as may ``out`` be ``x`` (every kernel reads a row of ``x``
        before it writes that row)."""
        what = "fused all-reduce + add + RMSNorm"
        check_input(x, self.comm.device, what)
        check_input(residual, self.comm.device, what + " (residual)")
        check_input(weight, self.comm.device, what + " (weight)")
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise InvalidInputError(f"{what}: dtype {x.dtype} is not supported (bf16, fp16)")
        if x.dim() != 2:
            raise InvalidInputError(f"{what}: x must be (tokens, hidden), got shape {tuple(x.shape)}")
        t, h = x.shape
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise InvalidInputError(f"{what}: residual {tuple(residual.shape)} {residual.dtype} does not match x "
                                    f"{tuple(x.shape)} {x.dtype}")
        if weight.shape != (h,):
            raise InvalidInputError(f"{what}: weight has shape {tuple(weight.shape)}, expected ({h},)")
        if h > self.max_hidden or t > self.max_tokens:
            raise InvalidInputError(f"{what}: ({t}, {h}) exceeds the ({self.max_tokens}, {self.max_hidden}) this "
                                    "instance was set up for")
        out_dtype = torch.float8_e4m3fn if fp8_scale is not None else x.dtype
        if fp8_scale is not None and (fp8_scale.numel() != 1 or fp8_scale.device != x.device):
            raise InvalidInputError(f"{what}: fp8_scale must be a one-element tensor on {x.device}")
        if out is None:
            out = torch.empty((t, h), dtype=out_dtype, device=x.device)
        elif out.shape != x.shape or out.dtype != out_dtype or not out.is_contiguous():
            raise InvalidInputError(f"{what}: out must be a contiguous ({t}, {h}) {out_dtype} tensor")
        if residual_out is None:
            residual_out = residual
        elif residual_out.shape != x.shape or residual_out.dtype != x.dtype or not residual_out.is_contiguous():
            raise InvalidInputError(f"{what}: residual_out must be a contiguous ({t}, {h}) {x.dtype} tensor")
        for name, a, b in (("out", out, residual_out), ("out", out, residual), ("residual_out", residual_out, residual),
                           ("out", out, weight), ("residual_out", residual_out, weight)):
            if a.data_ptr() != b.data_ptr() and _overlap(a, b):
                raise InvalidInputError(f"{what}: {name} partly overlaps another argument")
        if out.data_ptr() == residual_out.data_ptr() and out.numel():
            raise InvalidInputError(f"{what}: out and residual_out must be different tensors")
        nbytes = t * h * 2
        if algo is None:
            algo = self.select(t, h, x.dtype)
        elif algo not in self._channels or nbytes > self.capacity[algo]:
            raise InvalidInputError(f"{what}: variant {algo!r} is not set up for {nbytes} bytes "
                                    f"(capacities {self.capacity})")
        self.comm.check()
        if t == 0:
            return out
        self._debug_check(x.dtype, x.numel(), algo)
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        grid = (self._grids[algo],)
        scale = fp8_scale if fp8_scale is not None else weight  # any pointer when unused; no copy
        fp8 = fp8_scale is not None
        # the two-shot's rows: a shard's (R = ceil(t / world)); it walks chunks in column blocks
        if algo == "ll_twoshot":
            ch, cw = self.ll2_groups(t, h)  # NQ groups of W chunks per row
        else:
            ch, cw = self.chunks(-(-t // world) if algo == "twoshot" else t, h, self._grids[algo])
        block = triton.next_power_of_2(cw)
        if algo == "twoshot":
            block = min(block, TWOSHOT_MAX_COLS if self.comm.backend == "cuda" else TWOSHOT_MAX_COLS_CPU)
        ch_ = self._channels[algo]
        xch_off = ch_.buffer_off + self._xch[algo]
        common = (x, residual, residual_out, weight, out, scale, t, h, cw, self.eps, bases, rank, timeout, diag)
        tile = block * (triton.next_power_of_2(world) if algo in ("twoshot", "ll_twoshot") else 1)  # largest access
        meta = {"WORLD": world, "CH": ch, "BLOCK_C": block, "GEMMA": gemma, "FP8": fp8,
                "num_warps": 8 if tile >= 4096 else 4}
        if algo == "ll_twoshot":
            meta["NQ"] = meta.pop("CH")
            ll_twoshot_allreduce_add_rmsnorm_kernel[grid](
                *common, ch_.epochs_off, *self._ll2_offs, self._ll2_slot_words, xch_off, (h + 1) // 2, cw // 2,
                **meta)
        elif algo == "ll":
            ll_allreduce_add_rmsnorm_kernel[grid](*common, ch_.epochs_off, ch_.buffer_off, self._ll_slot_words,
                                                  xch_off, (h + 1) // 2, cw // 2, **meta)
        elif algo == "oneshot":
            allreduce_add_rmsnorm_kernel[grid](*common, ch_.flags_off, ch_.epochs_off, ch_.buffer_off,
                                               self._stage_bytes, xch_off, **meta)
        else:
            rs = ch_.buffer_off
            ag = rs + world * self._shard_bytes
            twoshot_allreduce_add_rmsnorm_kernel[grid](
                *common, ch_.flags_off, ch_.epochs_off, rs, ag, ag + world * self._shard_bytes, self._shard_bytes,
                self._rstd_slot, xch_off, **meta)
        return out
