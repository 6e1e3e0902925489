"""An engine's custom all-reduce slot (``ca_comm``), served by tritoncomm.

vLLM and SGLang each keep one custom all-reduce object per tensor-parallel group, built on the
group's CPU (gloo) group, and ask it first: ``should_custom_ar`` / ``custom_all_reduce`` (``None``
means "take your own path"), ``capture()`` around CUDA-graph capture, ``close()``. ``CustomAllReduceSlot``
is that object; the engine modules (``vllm``, ``sglang``) give it each engine's constructor.

Beyond the all-reduce it serves the sequence-parallel all-gather and reduce-scatter and, once
``setup_fused_norm`` has run, the fused all-reduce + residual add + RMSNorm (+ static FP8) with the
engine's rounding (``FusedAllReduceAddRMSNorm(rounding="engine")``).

Rules:
* A capability probe decides, by one vote on the group, whether tritoncomm serves it; if not,
  ``disabled`` is True, one line says why, and every ``should_*`` answers False.
* Whether a call is served depends only on the tensor's dtype, shape, layout and device, which are
  the same on every rank of a tensor-parallel step, so the ranks never disagree.
* Construction, ``setup_fused_norm``, ``register_graph_buffers`` and ``close`` are collective.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..channels import Communicator
from ..collectives import AllGather, AllReduce, FusedAllReduceAddRMSNorm, ReduceScatter
from ..collectives.fused_norm import MAX_HIDDEN, invariant_add_rms_norm
from ..collectives.validation import SUPPORTED_DTYPES
from ..config import CommConfig
from ..errors import InvalidInputError
from ..units import NO_LIMIT, round_up
from .capability import probe

__all__ = ["FUSED_RESERVE_BYTES", "CustomAllReduceSlot", "heap_bytes_for"]

log = logging.getLogger("tritoncomm")

_NORM_DTYPES = (torch.bfloat16, torch.float16)

#: Input bytes (tokens x hidden x 2) the heap keeps room for, for the fused all-reduce + RMSNorm.
FUSED_RESERVE_BYTES = 32 << 20


def heap_bytes_for(backend: str, world: int, max_size: int, max_all_gather_size: int,
                   max_reduce_scatter_size: int) -> int:
    """A heap that holds the slot's workspaces: at most two copies of each collective's largest
    message (three with Lamport's parity buffers on GPUs), the fused op's included, and never less
    than the backend's default."""
    copies = 3 if backend == "cuda" else 2
    need = copies * (max_size + world * max_all_gather_size + max_reduce_scatter_size + FUSED_RESERVE_BYTES)
    return max(CommConfig().resolved_heap_bytes(backend), round_up(need + (16 << 20), 1 << 20))


def _as_device(device: int | str | torch.device) -> torch.device:
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


class CustomAllReduceSlot:
    """tritoncomm in an engine's ``ca_comm`` slot.

    Args:
        group: the engine's CPU (gloo) group for the tensor-parallel ranks.
        device: this rank's device (``cpu`` in the CPU world).
        max_size: all-reduces of fewer bytes are served.
        max_all_gather_size: all-gathers of at most this many input bytes are served (0: none).
        max_reduce_scatter_size: reduce-scatters of at most this many input bytes are served (0: none).
        register_graph_buffers: on GPUs, map the outputs captured inside ``capture()`` into every peer
            on exit, so that graph replays write them directly (else the kernels copy out of the heap).
        config: the communicator's configuration (default: the default with ``heap_bytes_for``'s heap).
        batch_invariant: the engine's deterministic mode: the all-reduce serves every size (the engine's
            own fallbacks past ``max_size`` do not sum in a fixed order), inputs larger than the
            all-reduce's capacity in pieces of it. Each element's sum is the same fp32 sum over ranks
            0..W-1 with one rounding whatever the algorithm, the size or the piece, so a row's bits
            follow neither the batch it sits in nor where the pieces fall. The fused add + RMSNorm
            then serves batch-invariant rows too (``invariant_norm``).
        invariant_norm: the fused add + RMSNorm's rows batch-invariant (``FusedAllReduceAddRMSNorm``'s
            ``batch_invariant``), at every token count (``invariant_add_rms_norm``); default
            ``batch_invariant``.
    """

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, *, max_size: int,
                 max_all_gather_size: int, max_reduce_scatter_size: int, register_graph_buffers: bool = True,
                 config: CommConfig | None = None, batch_invariant: bool = False,
                 invariant_norm: bool | None = None) -> None:
        self._IS_CAPTURING = False
        self.batch_invariant = batch_invariant
        self.invariant_norm = batch_invariant if invariant_norm is None else invariant_norm
        self._register = register_graph_buffers
        self.disabled = True
        self.fully_connected = False
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.device = _as_device(device)
        self.max_size, self.max_all_gather_size = max_size, max_all_gather_size
        self.max_reduce_scatter_size = max_reduce_scatter_size
        self.ag: AllGather | None = None
        self.rs: ReduceScatter | None = None
        self.fused: FusedAllReduceAddRMSNorm | None = None
        if config is None:
            backend = "cpu" if self.device.type == "cpu" else "cuda"
            config = CommConfig(heap_bytes=heap_bytes_for(backend, self.world_size, max_size, max_all_gather_size,
                                                          max_reduce_scatter_size))
        verdict = probe(group, self.device, config)
        if not verdict.ok:
            verdict.log_once()
            return
        self.comm = Communicator(group, device=self.device, config=config)
        self.ar = AllReduce(self.comm, max_bytes=max_size, name="engine.ar")
        self.ag = AllGather(self.comm, max_bytes=self.world_size * max_all_gather_size,
                            name="engine.ag") if max_all_gather_size > 0 else None
        self.rs = ReduceScatter(self.comm, max_bytes=max_reduce_scatter_size,
                                name="engine.rs") if max_reduce_scatter_size > 0 else None
        self.fully_connected = True  # the probe checked peer access between every pair
        self.disabled = False

    # -- graph capture ---------------------------------------------------------------------------
    @contextmanager
    def capture(self) -> Iterator[None]:
        """Wrap CUDA-graph capture (the engines' ``graph_capture`` does). On GPUs, unless built with
        ``register_graph_buffers=False``, the outputs captured inside are mapped into every peer on
        exit (``Communicator.graph_capture``). Collective."""
        self._IS_CAPTURING = True
        try:
            if self.disabled or self.comm.backend != "cuda" or not self._register:
                yield
            else:
                with self.comm.graph_capture():
                    yield
        finally:
            self._IS_CAPTURING = False

    def register_graph_buffers(self) -> None:
        """Map the outputs met since the capture began into every peer (what ``capture`` does on
        exit). Collective."""
        if not self.disabled and self._register:
            self.comm.registered.commit()

    def _warming_up(self) -> bool:
        """Inside ``capture`` but not capturing: the engines' warm-up runs, which need only the
        outputs' allocations (their own kernels return empty tensors there too)."""
        return (self._IS_CAPTURING and self.comm.backend == "cuda"
                and not torch.cuda.is_current_stream_capturing())

    # -- all-reduce ------------------------------------------------------------------------------
    def _serves(self, inp: torch.Tensor, limit: int) -> bool:
        return (not self.disabled and inp.dtype in SUPPORTED_DTYPES and inp.is_contiguous()
                and inp.device == self.device and 0 < inp.numel() * inp.element_size() <= limit)

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        return self._serves(inp, NO_LIMIT if self.batch_invariant else self.max_size - 1)

    def all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None,
                   registered: bool = False) -> torch.Tensor:
        """Out-of-place sum. ``registered`` (an engine's promise that ``inp`` is IPC-registered)
        changes nothing: tritoncomm pushes from any input. Past the all-reduce's capacity (only in
        ``batch_invariant`` mode) the input goes in pieces of the capacity, every rank cutting alike."""
        piece = self.ar.max_bytes // inp.element_size()
        if inp.numel() <= piece:
            return self.ar(inp, out=out)
        if out is None:
            out = torch.empty_like(inp)
        src, dst = inp.view(-1), out.view(-1)
        for lo in range(0, src.numel(), piece):
            self.ar(src[lo:lo + piece], out=dst[lo:lo + piece])
        return out

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        """The sum of ``input`` over the group, or None when the engine should take its own path."""
        if not self.should_custom_ar(input):
            return None
        if self._warming_up():
            return torch.empty_like(input)
        return self.all_reduce(input)

    # -- sequence parallelism --------------------------------------------------------------------
    def should_custom_all_gather(self, inp: torch.Tensor) -> bool:
        return self.ag is not None and self._serves(inp, self.max_all_gather_size)

    def custom_all_gather(self, inp: torch.Tensor) -> torch.Tensor | None:
        """``inp`` of every rank concatenated along dim 0, or None (the engine's own path)."""
        if not self.should_custom_all_gather(inp):
            return None
        out = torch.empty((inp.shape[0] * self.world_size, *inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        return out if self._warming_up() else self.ag(inp, out)  # type: ignore[misc]

    def should_custom_reduce_scatter(self, inp: torch.Tensor) -> bool:
        return (self.rs is not None and self._serves(inp, self.max_reduce_scatter_size) and inp.dim() > 0
                and inp.shape[0] % self.world_size == 0)

    def custom_reduce_scatter(self, inp: torch.Tensor) -> torch.Tensor | None:
        """This rank's dim-0 slice of the sum over ranks, or None (the engine's own path)."""
        if not self.should_custom_reduce_scatter(inp):
            return None
        out = torch.empty((inp.shape[0] // self.world_size, *inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        return out if self._warming_up() else self.rs(inp, out)  # type: ignore[misc]

    # -- fused all-reduce + residual add + RMSNorm -----------------------------------------------
    def setup_fused_norm(self, max_tokens: int, hidden: int) -> bool:
        """Set up the fused all-reduce + add + RMSNorm for up to ``max_tokens`` rows of ``hidden``
        columns (again only if larger than before). Returns whether it is served. Collective; call
        it outside graph capture."""
        if self.disabled or not 0 < hidden <= MAX_HIDDEN or max_tokens <= 0:
            return False
        f = self.fused
        if f is not None and f.max_tokens >= max_tokens and f.max_hidden >= hidden:
            return True
        if f is not None:
            max_tokens, hidden = max(max_tokens, f.max_tokens), max(hidden, f.max_hidden)
            f.close()
            self.fused = None
        self.fused = FusedAllReduceAddRMSNorm(self.comm, max_tokens, hidden, rounding="engine",
                                              batch_invariant=self.invariant_norm, name="engine.fused_norm")
        return True

    def _norm_serves(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, max_tokens: int) -> bool:
        """2-D, contiguous, bf16/fp16, at most ``max_tokens`` rows and the set-up hidden size."""
        f = self.fused
        return (f is not None and not self.disabled and x.dim() == 2 and x.dtype in _NORM_DTYPES
                and 0 < x.shape[0] <= max_tokens and x.shape[1] <= f.max_hidden
                and residual.shape == x.shape and residual.dtype == x.dtype and weight.shape == (x.shape[1],)
                and x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
                and x.device == self.device == residual.device == weight.device)

    def should_fused_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether ``fused_add_rms_norm`` serves these (2-D, contiguous, bf16/fp16, within the set-up size)."""
        return self.fused is not None and self._norm_serves(x, residual, weight, self.fused.max_tokens)

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                           fp8_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm, residual + all_reduce(x))`` as new tensors, with the rounding of the engines'
        unfused path (the sum rounded before the add; FP8 from the rounded norm); ``norm`` is FP8 e4m3
        given ``fp8_scale``. Check ``should_fused_norm`` first."""
        residual_out = torch.empty_like(residual)
        if self._warming_up():
            dtype = torch.float8_e4m3fn if fp8_scale is not None else x.dtype
            return torch.empty_like(x, dtype=dtype), residual_out
        if self.fused is None:
            raise InvalidInputError("fused all-reduce + RMSNorm is not set up (call setup_fused_norm)")
        out = self.fused(x, residual, weight, fp8_scale=fp8_scale, residual_out=residual_out, eps=eps)
        return out, residual_out

    def should_invariant_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """With ``invariant_norm``, whether ``invariant_add_rms_norm`` serves these: what
        ``should_fused_norm`` takes, at any token count."""
        return self.invariant_norm and self._norm_serves(x, residual, weight, NO_LIMIT)

    def invariant_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                               fp8_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``fused_add_rms_norm`` at any token count with ``invariant_norm``, with the same bits
        per row: the fused kernel where it serves the batch, else the all-reduce (any size, in pieces)
        and ``fused_norm.local``'s add + RMSNorm, which groups the row alike. Check
        ``should_invariant_norm`` first."""
        if self.should_fused_norm(x, residual, weight):
            return self.fused_add_rms_norm(x, residual, weight, eps, fp8_scale=fp8_scale)
        if self._warming_up():
            dtype = torch.float8_e4m3fn if fp8_scale is not None else x.dtype
            return torch.empty_like(x, dtype=dtype), torch.empty_like(residual)
        return invariant_add_rms_norm(self.all_reduce(x), residual, weight, eps, fp8_scale=fp8_scale)

    def close(self) -> None:
        """Release everything. Collective."""
        if not self.disabled:
            for c in (self.ar, self.ag, self.rs, self.fused):
                if c is not None:
                    c.close()
            self.fused = None
            self.comm.close()
            self.disabled = True

    def __del__(self) -> None:
        # the engines drop ``ca_comm`` without closing it (their own classes close in ``__del__``);
        # every rank drops it at the same point, so the collective close meets its peers
        if not sys.is_finalizing():
            with suppress(Exception):
                self.close()
