"""Fused tensor-parallel epilogue: all-reduce + residual add + RMSNorm (+ FP8), host side.

Four variants, one per all-reduce shape, each a kernel and its launcher: LL packets (``ll``), the
LL two-shot (``ll_twoshot``), the one-shot (``oneshot``) and the two-shot by rows (``twoshot``),
picked by bytes from the table's picks (``fused_norm``; ``DEFAULT_PICKS`` where it has none) on GPUs at
TP2/TP4, else as the all-reduce table picks
for the same bytes. All of them sum the ranks in order 0..W-1 in fp32, add the residual in fp32 and
round once, so they give the same bits on every rank.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ...channels import Communicator
from ...errors import InvalidInputError
from ...units import NO_LIMIT
from ..allreduce import ALGORITHMS as ALLREDUCE_ALGORITHMS
from ..allreduce.defaults import default_rows as allreduce_default_rows
from ..base import CollectiveBase
from ..selection import SelectionTable
from ..validation import DTYPE_NAMES, check_input, overlap
from .lamport import LAMPORT_FUSED_PROGRAMS, FusedLamport
from .ll import FusedLL
from .ll_twoshot import FusedLLTwoShot
from .local import invariant_add_rms_norm
from .oneshot import FusedOneShot
from .rows import MAX_CHUNKS, RowPlan
from .twoshot import FusedTwoShot

__all__ = ["FUSED_ALGORITHMS", "FUSED_ALGOS", "INVARIANT_ALGOS", "MAX_HIDDEN", "DEFAULT_PICKS", "ROUNDINGS",
           "FusedAllReduceAddRMSNorm", "RowPlan", "invariant_add_rms_norm"]

#: Largest hidden size served.
MAX_HIDDEN = 16384
#: Where the fused op rounds (``FusedAllReduceAddRMSNorm``'s ``rounding``).
ROUNDINGS = ("fused", "engine")
#: The variants, by name, in registry order (debug codes, and the order in which a variant is
#: looked for when the selected one cannot serve a size).
FUSED_ALGORITHMS = MappingProxyType({cls.name: cls for cls in (FusedLL, FusedOneShot, FusedTwoShot, FusedLLTwoShot,
                                                               FusedLamport)})
#: The fused variant that serves where the all-reduce table names an all-reduce algorithm.
_FROM_TABLE = MappingProxyType({"ll": "ll", "ll_twoshot": "ll_twoshot", "oneshot": "oneshot", "twoshot": "twoshot",
                                "lamport": "lamport", "lamport_twoshot": "twoshot"})
#: Names of the fused variants, in registry order.
FUSED_ALGOS = tuple(FUSED_ALGORITHMS)
#: The variants that serve batch-invariant rows (``rows.py``, "Batch-invariant rows"), and what serves
#: in place of the others there: the two-shots sum a chunk in several blocks (``twoshot``) or in groups
#: of ``world`` chunks (``ll_twoshot``), which no power-of-two tree covers.
INVARIANT_ALGOS = ("ll", "oneshot", "lamport")
_INVARIANT_IN_PLACE = MappingProxyType({"twoshot": "oneshot", "ll_twoshot": "ll"})

#: The family's own picks, variant by bytes (``tokens x hidden x 2``) per world size, where the device's
#: table has none (``SelectionTable.picks``, op ``fused_norm``): the rows measured at TP2 on H200s and at
#: TP4 on H100s (``docs/algorithms.md``), which those devices' tables also hold. Rows of ``(max_bytes,
#: variant)``, the last serving everything larger. Used on GPUs; elsewhere, and for other world sizes,
#: the all-reduce table's choice for the same bytes.
DEFAULT_PICKS: dict[int, list[tuple[int, str]]] = {
    2: [(16 << 10, "ll"), (16 << 20, "lamport"), (32 << 20, "oneshot"), (NO_LIMIT, "twoshot")],
    4: [(16 << 10, "ll"), (512 << 10, "lamport"), (NO_LIMIT, "twoshot")],
}


class FusedAllReduceAddRMSNorm(CollectiveBase):
    """``residual += all_reduce(x)`` in place; returns ``rmsnorm(residual) * weight`` (or
    ``* (1 + weight)`` with ``gemma=True``), in ``x``'s dtype or, given ``fp8_scale``, FP8 e4m3
    (``clamp(y * (1 / scale), -448, 448)``, the reciprocal rounded once, as vLLM's static quantisation).

    Args:
        comm: the communicator.
        max_tokens, max_hidden: the largest ``x`` (tokens x hidden) served; ``max_hidden <= 16384``.
        eps: the RMSNorm epsilon.
        table: the all-reduce table; it picks the variant by bytes where the picks do
            not (the CPU world, other world sizes).
        algos: the variants to set up, each for every size up to the largest input (default: those
            the selection uses, each sized for what it serves).
        programs: the (fixed) grid of every variant (the LL variant's is at most 32).
        max_chunks: cut rows into at most this many chunks (GPUs; default 16, see ``RowPlan.chunks``).
        rounding: ``"fused"`` (default): the sum over ranks, the residual add and the norm in fp32, each
            output rounded once. ``"engine"``: the rounding points of the unfused path an engine runs
            (an all-reduce, then an add, then RMSNorm, then a static FP8 quantisation): the sum is
            rounded to the dtype before the residual is added, and FP8 is quantised from the norm's
            output rounded to the dtype, so that turning fusion on changes no output bit
            (``docs/algorithms.md``).
        batch_invariant: the engines' deterministic modes: a row's bits depend on its own inputs alone,
            not on the batch it sits in nor on the variant that serves it (the sum of squares as a
            pairwise tree over the padded row, ``fused_norm.rows``; only ``INVARIANT_ALGOS``, each
            two-shot's place taken by its one-shot).

    Inputs are bf16 or fp16, contiguous, ``(tokens, hidden)``; ``residual`` must be equal on every
    rank (as in a tensor-parallel model). Every rank gets the same bits. Collective to create and
    close; one instance per stream.
    """

    op = "allreduce"
    debug_op = "fused_add_rmsnorm"
    default_rows = staticmethod(allreduce_default_rows)  # the variant follows the all-reduce's rows
    ALGORITHMS = FUSED_ALGORITHMS

    def __init__(self, comm: Communicator, max_tokens: int, max_hidden: int, *, eps: float = 1e-6,
                 table: SelectionTable | None = None, algos: tuple[str, ...] | None = None,
                 programs: int | None = None, max_chunks: int | None = None, rounding: str = "fused",
                 batch_invariant: bool = False, name: str = "fused_add_rmsnorm") -> None:
        if not 0 < max_hidden <= MAX_HIDDEN:
            raise InvalidInputError(f"max_hidden must be in 1..{MAX_HIDDEN}, got {max_hidden}")
        if max_tokens <= 0:
            raise InvalidInputError(f"max_tokens must be positive, got {max_tokens}")
        if rounding not in ROUNDINGS:
            raise InvalidInputError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self._check_names(algos)
        if batch_invariant and algos is not None and any(a not in INVARIANT_ALGOS for a in algos):
            raise InvalidInputError(f"batch-invariant rows: only the variants {INVARIANT_ALGOS} serve them, "
                                    f"got {algos}")
        super().__init__(comm, table=table, fallback_group=None, name=name)
        self.max_tokens, self.max_hidden, self.eps = max_tokens, max_hidden, eps
        self.rounding = rounding
        self.batch_invariant = batch_invariant
        self.max_bytes = max_tokens * max_hidden * 2
        cuda = comm.backend == "cuda"
        p = programs or (64 if cuda else 2)
        # rows are cut into chunks only where programs run concurrently (see fused_norm.rows)
        chunks = min(max_chunks or MAX_CHUNKS, MAX_CHUNKS, p) if cuda else 1
        self.plan = RowPlan(comm.world, max_tokens, max_hidden, p, chunks, cuda, tree=batch_invariant)
        self.table.check_algorithms("fused_norm", tuple(FUSED_ALGORITHMS))
        picks = self.table.picks_for("fused_norm", comm.world) or DEFAULT_PICKS.get(comm.world)
        self.selection = [(hi, self._invariant(a)) for hi, a in picks] if cuda and picks else None
        caps: dict[str, int] = {}
        if self.selection is not None and algos is None:
            lo = 0
            for hi, a in self.selection:
                if lo < self.max_bytes:
                    caps[a] = max(caps.get(a, 0), min(hi, self.max_bytes))
                lo = hi
        else:
            for a, c in self._capacities(self.max_bytes, algos).items():
                v = self._invariant(_FROM_TABLE[a])
                caps[v] = max(caps.get(v, 0), c)
        grids = {name: p for name in self.ALGORITHMS}
        grids["ll"] = min(p, 32)
        if cuda and programs is None:
            grids["lamport"] = LAMPORT_FUSED_PROGRAMS
        self._setup(caps, grids, plan=self.plan)

    def _invariant(self, variant: str) -> str:
        """``variant``, or with ``batch_invariant`` the one that serves in its place."""
        return _INVARIANT_IN_PLACE.get(variant, variant) if self.batch_invariant else variant

    def _table_names(self) -> tuple[str, ...]:
        return tuple(ALLREDUCE_ALGORITHMS)  # the variant follows the all-reduce table

    @property
    def max_chunks(self) -> int:
        return self.plan.max_chunks

    def chunks(self, tokens: int, hidden: int, programs: int | None = None) -> tuple[int, int]:
        """``(CH, CW)``: see ``RowPlan.chunks``."""
        return self.plan.chunks(tokens, hidden, programs)

    def ll2_groups(self, tokens: int, hidden: int) -> tuple[int, int]:
        """``(NQ, CW)`` of the LL two-shot: see ``RowPlan.ll2_groups``."""
        return self.plan.ll2_groups(tokens, hidden)

    def select(self, tokens: int, hidden: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """The variant for ``(tokens, hidden)`` (the same on every rank)."""
        nbytes = tokens * hidden * 2
        if self.selection is not None:
            algo = next(a for hi, a in self.selection if nbytes <= hi)
        else:
            algo = self._invariant(_FROM_TABLE[self.table.lookup(self.op, self.world, DTYPE_NAMES[dtype], nbytes,
                                                                 self._defaults).algo])
        if algo not in self._algos or nbytes > self._algos[algo].capacity:
            algo = self._first_serving(nbytes)
        return algo

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, gemma: bool = False,
                 fp8_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 residual_out: torch.Tensor | None = None, algo: str | None = None,
                 eps: float | None = None) -> torch.Tensor:
        """Run it. ``residual_out`` (default ``residual``: in place) receives the new residual; it may
        be ``residual`` or ``x`` itself, as may ``out`` be ``x`` (every kernel reads a row of ``x``
        before it writes that row). ``eps`` overrides the instance's epsilon for this call."""
        out, residual_out = self._check(x, residual, weight, fp8_scale, out, residual_out)
        t, h = x.shape
        nbytes = t * h * 2
        if algo is None:
            algo = self.select(t, h, x.dtype)
        elif algo not in self._algos or nbytes > self._algos[algo].capacity:
            raise InvalidInputError(f"fused all-reduce + add + RMSNorm: variant {algo!r} is not set up for {nbytes} "
                                    f"bytes (capacities {self.capacity})")
        self.check()
        if t == 0:
            self._nothing_to_move(x.dtype)
            return out
        self._debug_check(x.dtype, x.numel(), algo)
        scale = fp8_scale if fp8_scale is not None else weight  # any pointer when unused; no copy
        self._algos[algo].launch(x, residual, residual_out, weight, out, scale, gemma=gemma,
                                 fp8=fp8_scale is not None, eps=self.eps if eps is None else eps,
                                 engine=self.rounding == "engine", sig=self._signature(x.dtype, x.numel(), algo))
        return out

    def _check(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, fp8_scale: torch.Tensor | None,
               out: torch.Tensor | None, residual_out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate the arguments (``InvalidInputError`` before anything runs); return ``out`` and
        ``residual_out``, made or defaulted."""
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
            if a.data_ptr() != b.data_ptr() and overlap(a, b):
                raise InvalidInputError(f"{what}: {name} partly overlaps another argument")
        if out.data_ptr() == residual_out.data_ptr() and out.numel():
            raise InvalidInputError(f"{what}: out and residual_out must be different tensors")
        return out, residual_out
