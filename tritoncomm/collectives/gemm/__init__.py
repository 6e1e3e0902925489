"""Row-parallel linear with its all-reduce: ``sum over ranks of x @ w.T``, host side.

Three paths, chosen by the number of tokens (rows of ``x``):

* ``"overlap"``: one persistent Triton kernel (``gemm.twoshot``): a TMA GEMM whose epilogue pushes
  each output tile's product to the tile's owner rank, which sums the tile and pushes the result to
  every rank while the GEMM goes on (a two-shot all-reduce folded into the GEMM);
* ``"chunked"``: the rows in ``chunks`` slices; cuBLAS computes slice i+1 on the caller's stream
  while tritoncomm's ``AllReduce`` reduces slice i on a high-priority side stream with at most
  ``side_programs`` programs, so the GEMM keeps most SMs (an event per slice orders them;
  capturable in CUDA graphs as a fork and join);
* ``"plain"``: ``torch.matmul`` (cuBLAS on GPUs), then tritoncomm's ``AllReduce``.

The plain and chunked paths write the GEMM's output into a staging tensor allocated once at set-up
(in the heap, ``Communicator.empty``), so no call allocates. No peer reads it: the all-reduce
algorithms push from their input or copy it into their own staging buffer first (reading peers'
staged products in place measured slower, see ``allreduce.twoshot``), so the next call may
overwrite it. The chunked path joins its side stream
before it returns.

The plain path serves decode-sized inputs, where there is too little compute to hide anything
behind; ``select`` picks by rows with thresholds measured on H200 (``docs/algorithms.md``), and
``path=`` forces one. The overlapped kernel loads its operands through TMA descriptors, so it needs
``K`` a multiple of 8 elements (16-byte rows); other shapes take the plain path. Every path gives
the same bits on every rank; they round differently from each other (cuBLAS's and Triton's GEMMs
sum K in different orders).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch

from ...channels import Channel, Communicator
from ...errors import InvalidInputError, TritonCommError
from ...kernels.barrier import barrier_flag_bytes
from ...kernels.consistency import DTYPE_CODES, OP_CODES, pack_signature
from ...units import cdiv
from ..allreduce import AllReduce
from ..validation import DTYPE_NAMES, check_input
from .twoshot import gemm_twoshot_kernel

__all__ = ["GEMM_PATHS", "GEMM_SWITCHES", "GemmAllReduce", "GemmConfig"]

GEMM_PATHS = ("overlap", "chunked", "plain")
#: Most row slices of the chunked path.
MAX_CHUNKS = 16
#: The path switch points a device's selection table may hold (``SelectionTable.switches``, op ``gemm``,
#: per world), and their defaults where it holds none: the overlapped kernel from this many rows, the
#: chunked path from this many (``docs/algorithms.md``, "GEMM + all-reduce").
GEMM_SWITCHES = MappingProxyType({"overlap_from_tokens": 512, "chunked_from_tokens": 4096})


@dataclass(frozen=True)
class GemmConfig:
    """Launch shape of the overlapped kernel: tile sizes, programs, pipelining.

    ``programs``: the persistent grid (None: one per SM). Every program must be resident at once
    (see ``gemm_twoshot``), so it may not exceed the SM count; the CPU world always runs one.
    ``defer``: publish each tile's stores after the next tile's product (``gemm_twoshot``'s
    ``DEFER``). ``rows_per_step``: rows of a tile that the owner sums (and step 3 copies) at a
    time; each step waits for its loads, so fewer, larger steps shorten the epilogue."""

    bm: int = 128
    bn: int = 256
    bk: int = 64
    group_m: int = 8
    programs: int | None = None
    rows_per_step: int = 64
    num_warps: int = 8
    num_stages: int = 4
    defer: bool = False

    def __post_init__(self) -> None:
        for name in ("bm", "bn", "bk", "rows_per_step"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {v}")
        if self.rows_per_step > self.bm or self.group_m < 1 or (self.programs is not None and self.programs < 1):
            raise ValueError(f"bad GemmConfig {self}")

    @classmethod
    def for_backend(cls, backend: str) -> GemmConfig:
        if backend == "cuda":
            return cls()
        return cls(bm=16, bn=16, bk=16, group_m=2, programs=1, rows_per_step=16, num_warps=1, num_stages=1)


class GemmAllReduce:
    """``out = all_reduce(x @ w.T)`` for ``x`` (tokens x K) and ``w`` (N x K), bf16 or fp16.

    Args:
        comm: the communicator.
        max_tokens: the most rows ``x`` may have.
        n: the output features ``N`` (rows of every ``w`` passed).
        overlap_min_tokens: inputs with at least this many rows take the overlapped kernel (None: never;
            ``"table"``: the device table's ``overlap_from_tokens``, ``GEMM_SWITCHES``). Below it the kernel's GEMM
            reads the weight with too few tiles in flight to beat cuBLAS (``docs/algorithms.md``, "GEMM +
            all-reduce"). GPUs without TMA (before sm_90) never take it.
        chunked_min_tokens, chunks: inputs with at least this many rows (and below
            ``overlap_min_tokens``, or on GPUs without TMA) take the chunked path, in this many row
            slices (``"table"``: the table's ``chunked_from_tokens``).
        side_programs: the most programs a slice's all-reduce may use in the chunked path (None:
            the table's shape): fewer leave more SMs to the GEMM it overlaps.
        sm_carveout: in the chunked path, ask cuBLASLt to leave this many SMs free for the slices'
            all-reduces (torch's experimental SM carve-out, set around the GEMMs and restored;
            None: cuBLAS as configured). Off by default: it measured slower than no carve-out.
        config: the overlapped kernel's launch shape (default: per backend).
        allreduce: an ``AllReduce`` for the plain path (default: one of its own, sized for the
            largest output).

    Workspace: about ``3 x max_tokens x N`` elements (the staging tensor, and the overlapped
    kernel's ``recv`` and ``fin`` tile buffers, padded to whole tiles) plus two flags per tile.
    Collective to create and close; one instance per stream.
    """

    def __init__(self, comm: Communicator, max_tokens: int, n: int, *,
                 overlap_min_tokens: int | Literal["table"] | None = "table",
                 chunked_min_tokens: int | Literal["table"] = "table", chunks: int = 2, side_programs: int | None = 32,
                 sm_carveout: int | None = None, config: GemmConfig | None = None, allreduce: AllReduce | None = None,
                 name: str = "gemm_allreduce") -> None:
        if max_tokens <= 0 or n <= 0:
            raise InvalidInputError(f"max_tokens and n must be positive, got {max_tokens}, {n}")
        comm.require_open("GemmAllReduce")
        self.comm, self.max_tokens, self.n = comm, max_tokens, n
        self._closed = False
        # the overlapped kernel loads through TMA descriptors: Hopper or newer (the CPU world emulates them)
        self._tma = comm.backend != "cuda" or torch.cuda.get_device_capability(comm.device)[0] >= 9
        self.chunks = chunks
        if not 1 <= chunks <= MAX_CHUNKS:
            raise InvalidInputError(f"chunks must be in 1..{MAX_CHUNKS}, got {chunks}")
        if side_programs is not None and side_programs < 1:
            raise InvalidInputError(f"side_programs must be positive, got {side_programs}")
        self.side_programs = side_programs
        self.sm_carveout = self._check_carveout(sm_carveout, comm)
        # high priority: a slice's reduction takes SMs as the GEMM's blocks retire, not after them
        self._side = torch.cuda.Stream(comm.device, priority=-1) if comm.backend == "cuda" else None
        self._events = [torch.cuda.Event() for _ in range(MAX_CHUNKS)] if comm.backend == "cuda" else []
        self.cfg = config or GemmConfig.for_backend(comm.backend)
        c = self.cfg
        self._programs = 1 if comm.backend != "cuda" else self._check_programs(c.programs, comm)
        self._own_ar = allreduce is None
        self.allreduce = allreduce or AllReduce(comm, max_bytes=max_tokens * n * 2, name=f"{name}.ar")  # 16-bit
        switches = {**GEMM_SWITCHES, **self.allreduce.table.switches_for("gemm", comm.world)}
        if overlap_min_tokens == "table":
            overlap_min_tokens = switches["overlap_from_tokens"]
        if chunked_min_tokens == "table":
            chunked_min_tokens = switches["chunked_from_tokens"]
        self.overlap_min_tokens, self.chunked_min_tokens = overlap_min_tokens, chunked_min_tokens
        max_tiles = cdiv(max_tokens, c.bm) * cdiv(n, c.bn)
        tile_bytes = c.bm * c.bn * 2
        recv_tiles = cdiv(max_tiles, comm.world) * comm.world
        # flags: (owned tile, source) for the partials, then one per tile for the finals; then the
        # programs' header slots (barrier entries), from the first whole slot after the flags
        self._fflags = recv_tiles
        flag_words = recv_tiles + max_tiles
        hdr_slot = cdiv(4 * flag_words, barrier_flag_bytes(1))
        self._hdr_rel = hdr_slot * barrier_flag_bytes(1)  # from the channel's flags
        self._stage: torch.Tensor | None = None
        try:
            self.channel = Channel(comm, name, programs=self._programs,
                                   barrier_slots=hdr_slot + self._programs,
                                   buffer_bytes=(recv_tiles + max_tiles) * tile_bytes)
            self._stage = comm.empty(max_tokens * n * 2, torch.uint8)  # the GEMM's output, symmetric
        except BaseException:
            if getattr(self, "channel", None) is not None:
                self.channel.close()
            if self._own_ar:
                self.allreduce.close()
            raise
        comm.bootstrap.barrier()

    @property
    def workspace_bytes(self) -> int:
        own = self.channel.heap_bytes + self.max_tokens * self.n * 2
        return own + (self.allreduce.workspace_bytes if self._own_ar else 0)

    def _staged(self, m: int, dtype: torch.dtype) -> torch.Tensor:
        """The first ``m`` rows of the symmetric staging tensor, as ``dtype``."""
        assert self._stage is not None
        return self._stage[:m * self.n * 2].view(dtype).view(m, self.n)

    def select(self, tokens: int, k: int = 8) -> str:
        """The path for ``tokens`` rows and ``k`` input features (the overlapped kernel needs ``k`` a
        multiple of 8)."""
        if self._tma and self.overlap_min_tokens is not None and tokens >= self.overlap_min_tokens and k % 8 == 0:
            return "overlap"
        return "chunked" if tokens >= self.chunked_min_tokens else "plain"

    @staticmethod
    def _check_programs(programs: int | None, comm: Communicator) -> int:
        sms = torch.cuda.get_device_properties(comm.device).multi_processor_count
        if programs is None:
            return sms
        if programs > sms:
            raise InvalidInputError(f"GemmConfig.programs must be at most the {sms} SMs (all resident), got {programs}")
        return programs

    @staticmethod
    def _check_carveout(sm_carveout: int | None, comm: Communicator) -> int | None:
        if sm_carveout is None or comm.backend != "cuda":
            return None
        if not hasattr(torch._C, "_set_sm_carveout_experimental"):
            raise InvalidInputError("sm_carveout: this torch has no SM carve-out for matmuls")
        sms = torch.cuda.get_device_properties(comm.device).multi_processor_count
        if not 0 < sm_carveout < sms:
            raise InvalidInputError(f"sm_carveout must be in 1..{sms - 1}, got {sm_carveout}")
        return sm_carveout

    def _chunked(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, chunks: int,
                 progs: int | None, carveout: int | None) -> torch.Tensor:
        m = x.shape[0]
        step = cdiv(m, chunks)
        stage = self._staged(m, x.dtype)
        if self._side is None:  # CPU world: the same slices, one after another
            for lo in range(0, m, step):
                torch.matmul(x[lo:lo + step], w.t(), out=stage[lo:lo + step])
                self.allreduce(stage[lo:lo + step], out=out[lo:lo + step], programs=progs)
            return out
        main = torch.cuda.current_stream(self.comm.device)
        self._side.wait_stream(main)  # the slices' reductions come after everything before this call
        saved = None
        if carveout is not None:  # process-wide torch settings: set around the GEMMs, then restored
            saved = (torch._C._get_sm_carveout_experimental(), torch.backends.cuda.preferred_blas_library())
            torch.backends.cuda.preferred_blas_library("cublaslt")  # the carve-out is a cuBLASLt attribute
            torch._C._set_sm_carveout_experimental(carveout)
        try:
            for i, lo in enumerate(range(0, m, step)):
                torch.matmul(x[lo:lo + step], w.t(), out=stage[lo:lo + step])
                self._events[i].record(main)
                self._side.wait_event(self._events[i])
                with torch.cuda.stream(self._side):
                    self.allreduce(stage[lo:lo + step], out=out[lo:lo + step], programs=progs)
        finally:
            if saved is not None:
                torch._C._set_sm_carveout_experimental(saved[0])
                torch.backends.cuda.preferred_blas_library(saved[1])
        # the next call's GEMM overwrites the staging tensor: after this call's reductions (whose
        # barriers also mean every peer has finished reading this rank's slices)
        main.wait_stream(self._side)
        return out

    def __call__(self, x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None,
                 path: str | None = None, chunks: int | None = None, side_programs: int | None = None,
                 sm_carveout: int | None = None) -> torch.Tensor:
        """``all_reduce(x @ w.T)`` into ``out`` (new if None), by ``path`` (default: ``select``);
        ``chunks``, ``side_programs`` and ``sm_carveout`` override the chunked path's settings
        (every rank must pass the same)."""
        what = "gemm + all_reduce"
        if self._closed:
            raise TritonCommError("GemmAllReduce is closed")
        check_input(x, self.comm.device, what)
        check_input(w, self.comm.device, what + " (weight)")
        if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype:
            raise InvalidInputError(f"{what}: x and w must both be bf16 or both fp16, got {x.dtype} and {w.dtype}")
        if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
            raise InvalidInputError(f"{what}: x (tokens, K) and w (N, K) do not match: {tuple(x.shape)} and "
                                    f"{tuple(w.shape)}")
        m, k = x.shape
        if w.shape[0] != self.n or m > self.max_tokens:
            raise InvalidInputError(f"{what}: output ({m}, {w.shape[0]}) exceeds the ({self.max_tokens}, {self.n}) "
                                    "this instance was set up for")
        if path is not None and path not in GEMM_PATHS:
            raise InvalidInputError(f"{what}: unknown path {path!r}; known: {GEMM_PATHS}")
        if out is None:
            out = torch.empty((m, self.n), dtype=x.dtype, device=x.device)
        elif out.shape != (m, self.n) or out.dtype != x.dtype or not out.is_contiguous():
            raise InvalidInputError(f"{what}: out must be a contiguous ({m}, {self.n}) {x.dtype} tensor")
        forced = path is not None
        path = path or self.select(m, k)
        if path == "overlap" and not forced and (x.data_ptr() % 16 or w.data_ptr() % 16):
            path = "plain"  # a view off 16-byte alignment: TMA cannot load it
        if path == "chunked" and m > 0 and k > 0:
            c = chunks if chunks is not None else self.chunks
            if not 1 <= c <= MAX_CHUNKS:
                raise InvalidInputError(f"{what}: chunks must be in 1..{MAX_CHUNKS}, got {c}")
            progs = side_programs if side_programs is not None else self.side_programs
            if progs is not None and progs < 1:
                raise InvalidInputError(f"{what}: side_programs must be positive, got {progs}")
            cv = self._check_carveout(sm_carveout, self.comm) if sm_carveout is not None \
                else self.sm_carveout
            return self._chunked(x, w, out, c, progs, cv)
        if m == 0 or k == 0:
            torch.matmul(x, w.t(), out=out)
            return self.allreduce(out, out=out)
        if path == "plain" or path == "chunked":
            stage = self._staged(m, x.dtype)
            torch.matmul(x, w.t(), out=stage)
            return self.allreduce(stage, out=out)
        if not self._tma:
            raise InvalidInputError(f"{what}: the overlapped path needs TMA (sm_90 or newer)")
        if k % 8 or x.data_ptr() % 16 or w.data_ptr() % 16:
            raise InvalidInputError(f"{what}: the overlapped path loads rows of x and w through TMA and needs K a "
                                    f"multiple of 8 and both 16-byte aligned, got K = {k}")
        return self._overlap(x, w, out, comm=True)

    def local_gemm(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out = x @ w.T`` on this rank alone, by the overlapped kernel's GEMM with no communication:
        what the overlap costs is measured against it. Same input rules as the overlapped path."""
        return self._overlap(x, w, out, comm=False)

    def _overlap(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, comm: bool) -> torch.Tensor:
        from triton.tools.tensor_descriptor import TensorDescriptor

        m, k = x.shape
        c = self.cfg
        cm = self.comm
        cm.check()
        row = (cm.peer_row(out) or 0) if comm else 0
        if cm.debug and comm:  # op, dtype, element count, the (M, K) shape and the output's row must agree
            cm.debug_check(OP_CODES["gemm_allreduce"], DTYPE_CODES[DTYPE_NAMES[x.dtype]], m * self.n,
                           k * 4096 + (cm.peer_slot(row) + 1 if row else 0))
        bases, rank, world, timeout, diag = cm.kernel_args()
        ch = self.channel
        tile_bytes = c.bm * c.bn * 2
        sig = self._signature(x.dtype, m, k, bool(row)) if comm else None
        gemm_twoshot_kernel[(self._programs,)](
            TensorDescriptor.from_tensor(x, [c.bm, c.bk]), TensorDescriptor.from_tensor(w, [c.bn, c.bk]), out, row,
            m, self.n, k, bases, rank, timeout, diag, ch.epochs_off, ch.flags_off, ch.flags_off + 4 * self._fflags,
            ch.buffer_off, ch.buffer_off + self._fflags * tile_bytes,
            ch.flags_off + self._hdr_rel, sig, WORLD=world, BM=c.bm, BN=c.bn, BK=c.bk,
            GROUP_M=c.group_m, RB=c.rows_per_step, OUT_REG=bool(row), COMM=comm, DEFER=c.defer, num_warps=c.num_warps,
            num_stages=c.num_stages)
        return out

    def _signature(self, dtype: torch.dtype, m: int, k: int, out_reg: bool) -> int | None:
        """The overlapped call's signature, which its programs compare (``gemm.twoshot``, "Call check"):
        op, dtype, output elements, and in the algorithm byte the output's form (registered or not) and
        ``K / 8`` (mod 32); None when the communicator's ``check_calls`` is off."""
        if not self.comm.config.check_calls:
            return None
        algo = 1 | int(out_reg) << 1 | (k // 8 % 32) << 2
        return pack_signature(OP_CODES["gemm_allreduce"], DTYPE_CODES[DTYPE_NAMES[dtype]], m * self.n, algo)

    def close(self) -> None:
        """Collective: return the workspace to the heap. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stage is not None:
            self.comm.free(self._stage)
            self._stage = None
        self.channel.close()
        if self._own_ar:
            self.allreduce.close()
