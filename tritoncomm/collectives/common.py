"""What every collective's host side shares: its channels, its table, and the NCCL fallback."""

from __future__ import annotations

import hashlib
import logging

import torch
import torch.distributed as dist

from ..channels import Channel, Communicator
from ..errors import SetupMismatchError
from .tuning import Choice, SelectionTable, default_choice, default_table, load_table

__all__ = ["CollectiveBase", "round_up"]

log = logging.getLogger("tritoncomm")


_OP_CODES = {"allreduce": 1, "allgather": 2, "reducescatter": 3, "fused_add_rmsnorm": 4, "gemm_allreduce": 5}
_DTYPE_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
_ALGO_CODES = {"ll": 1, "oneshot": 2, "twoshot": 3, "pipelined": 4, "push": 5, "ll_twoshot": 6, "fallback": 99}


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class CollectiveBase:
    """Owns channels in the communicator's heap; creation and ``close`` are collective."""

    op = ""  #: the table's op
    debug_op = ""  #: the op named in debug-mode signatures (default: ``op``)

    def __init__(self, comm: Communicator, *, table: SelectionTable | None, fallback_group: dist.ProcessGroup | None,
                 name: str) -> None:
        self.comm = comm
        self.name = name
        self.world = comm.world
        device_name = torch.cuda.get_device_name(comm.device) if comm.backend == "cuda" else ""
        self.table = table or load_table(comm.backend, device_name)
        self.fallback_group = fallback_group
        self._channels: dict[str, Channel] = {}
        self._grids: dict[str, int] = {}
        self._closed = False
        self._warned_fallback = False
        digests = comm.bootstrap.all_gather(self.table.digest())
        if any(d != digests[0] for d in digests):
            raise SetupMismatchError(f"{name}: ranks loaded different selection tables ({digests}); every rank "
                                     "must make the same algorithm choice")

    def _add_channel(self, algo: str, *, programs: int, barrier_slots: int, buffer_bytes: int) -> None:
        try:
            self._channels[algo] = Channel(self.comm, f"{self.name}.{algo}", programs=programs,
                                           barrier_slots=barrier_slots, buffer_bytes=buffer_bytes)
            self._grids[algo] = programs
        except BaseException:
            self.close()
            raise

    def _grid_for(self, algo: str) -> int:
        """Programs in ``algo``'s (fixed) grid: the most that any row of the table asks for."""
        rows = self.table.choices(self.op, self.world) + default_table(self.comm.backend).choices(self.op, self.world)
        return max([default_choice(algo, self.comm.backend).programs, *(c.programs for _, c in rows if c.algo == algo)])

    def _capacities(self, max_bytes: int, algos: tuple[str, ...] | dict[str, int] | None) -> dict[str, int]:
        """Largest message each algorithm must serve: what the table routes to it up to ``max_bytes``;
        or ``max_bytes`` for every algorithm named in ``algos``; or, if ``algos`` maps algorithms to
        sizes, those sizes (capped at ``max_bytes``)."""
        if isinstance(algos, dict):
            return {a: min(c, max_bytes) for a, c in algos.items()}
        if algos is not None:
            return {a: max_bytes for a in algos}
        caps: dict[str, int] = {}
        for dtype in ("bf16", "fp16", "fp32"):
            lo = 0
            rows = self.table.rows.get((self.op, self.world, dtype)) or \
                default_table(self.comm.backend).rows[(self.op, min(self.world, 8), dtype)]
            for i, (hi, c) in enumerate(rows):
                if lo < max_bytes:
                    top = max_bytes if i == len(rows) - 1 else min(hi, max_bytes)  # the last row serves the rest
                    caps[c.algo] = max(caps.get(c.algo, 0), top)
                lo = hi
        return caps

    def _choice(self, algo: str, dtype: str, nbytes: int) -> Choice:
        """The table's launch shape for ``algo`` at this size, or the nearest row that uses ``algo``."""
        c = self.table.lookup(self.op, self.world, dtype, nbytes)
        if c.algo != algo:
            rows = [ch for _, ch in self.table.choices(self.op, self.world) if ch.algo == algo]
            c = rows[0] if rows else default_choice(algo, self.comm.backend)
        return Choice(c.algo, min(c.programs, self._grids[algo]), c.block, c.num_warps)

    def _debug_check(self, dtype: torch.dtype, count: int, algo: str, variant: tuple = ()) -> None:
        """Debug mode: all ranks must call with the same (op, dtype, count, algorithm); ``variant``
        (e.g. the zero-copy choice and the symmetric tensors' heap offsets) must agree too, folded
        into the algorithm word."""
        if self.comm.debug:
            op = _OP_CODES[self.debug_op or self.op]
            code = _ALGO_CODES.get(algo, 99)
            if variant:  # a deterministic 40-bit digest above the algorithm code
                digest = int.from_bytes(hashlib.sha1(repr(variant).encode()).digest()[:5], "little")
                code |= digest << 8
            self.comm.debug_check(op, _DTYPE_CODES[dtype], count, code)

    def _note_fallback(self, nbytes: int, limit: int) -> None:
        if not self._warned_fallback:
            self._warned_fallback = True
            log.warning("tritoncomm %s: %d bytes exceed max_bytes=%d; using torch.distributed (%s) for such sizes",
                        self.op, nbytes, limit, dist.get_backend(self.fallback_group))

    @property
    def algorithms(self) -> tuple[str, ...]:
        return tuple(self._channels)

    @property
    def workspace_bytes(self) -> int:
        """Heap bytes this collective holds on each rank."""
        return sum(ch.heap_bytes for ch in self._channels.values())

    def close(self) -> None:
        """Collective: return the workspace to the heap."""
        if self._closed:
            return
        self._closed = True
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
