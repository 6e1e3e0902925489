"""``MoEAllToAll``: the MoE collective's host side (the package docstring describes it). Set-up
checks its arguments and plans the instance (``plan.py``), lays out its memory (``buffers.py``) and
builds its algorithms with their launchers (``launches.py``); a call checks its inputs, picks its
path (every rank alike) and launches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...channels import Communicator
from ...errors import InvalidInputError, TritonCommError
from ...kernels.consistency import DTYPE_CODES, OP_CODES, pack_signature
from ..validation import DTYPE_NAMES
from .buffers import MoEBuffers
from .combine import COMBINE_STAGES
from .launches import Combine, OneKernelDispatch, TwoKernelDispatch
from .onekernel import DISPATCH_STAGES
from .plan import device_facts, plan_instance
from .route import ROUTED_STAGES
from .shape import MoEShape

__all__ = ["DISPATCH_PATHS", "MoEAllToAll", "MoEHandle"]

#: What ``dispatch_path`` answers; a path's code in the call's signature is its place here, from 1.
DISPATCH_PATHS = ("one-kernel", "routed", "routed-direct", "send-gather")


@dataclass(frozen=True)
class MoEHandle:
    """What ``combine`` needs from its ``dispatch``: the token count, the call it came from, and the
    call's bound on every rank's token count (``tokens_bound``, else ``max_tokens``), which also
    picks the launch shape."""

    n_tokens: int
    call: int
    bound: int


class MoEAllToAll:
    """See the package docstring (``collectives/moe/__init__.py``)."""

    def __init__(self, comm: Communicator, *, max_tokens: int, hidden: int, num_experts: int, top_k: int,
                 dtype: torch.dtype = torch.bfloat16, capacity: int | None = None, fp8_dispatch: bool = False,
                 mode: str = "auto", throughput_from: int | None = None, prefill_from: int | None = None,
                 shape: MoEShape | None = None, decode_shape: MoEShape | None = None, decode_below: int | None = None,
                 name: str = "moe") -> None:
        sms, switches = device_facts(comm.backend, comm.device, comm.world)
        p = plan_instance(comm.backend, comm.world, sms, switches, max_tokens=max_tokens, hidden=hidden,
                          num_experts=num_experts, top_k=top_k, dtype=dtype, capacity=capacity,
                          fp8_dispatch=fp8_dispatch, mode=mode, throughput_from=throughput_from,
                          prefill_from=prefill_from, shape=shape, decode_shape=decode_shape,
                          decode_below=decode_below)
        #: the set-up decisions every rank makes alike
        self.plan = p
        self.comm, self.world, self.rank = comm, p.world, comm.rank
        self.max_tokens, self.hidden, self.num_experts, self.top_k, self.dtype = (p.max_tokens, p.hidden,
                                                                                  p.num_experts, p.top_k, p.dtype)
        self.local_experts, self.capacity, self.fp8, self.mode = p.local_experts, p.capacity, p.fp8, p.mode
        self.shape, self.decode_shape = p.shape, p.decode_shape
        #: the instance's memory (``buffers.py``), for inspection
        self.memory = MoEBuffers(comm, p, name)
        self._one = OneKernelDispatch(comm, p, self.memory)
        self._two = TwoKernelDispatch(comm, p, self.memory, self._one.opts)
        self._combine = Combine(comm, p, self.memory, self._one.opts, self._one.decode_opts)
        #: the algorithms and their launchers (``launches.py``), by name, for inspection
        self.algorithms = {"one-kernel": self._one, "two-kernel": self._two, "combine": self._combine}
        self._closed = False
        self._bad_reported = 0
        self._call = 0
        self._open_handle = -1
        #: stage stamps of the one-kernel dispatch, the combine and the routed dispatch (``trace_stages``), or None
        self._traces: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._trace_from = 0  # the count of dispatches when the stamps were turned on

    # -- what callers use ------------------------------------------------------------------------
    def expert_buffer(self) -> torch.Tensor:
        """``[local_experts, capacity, hidden]`` in the heap: experts that write their outputs here
        spare ``combine`` a copy. Write it on the calling stream between ``dispatch`` and ``combine``
        (only this rank's ``combine`` reads it)."""
        return self.memory.ybuf

    def buffers(self) -> dict[str, torch.Tensor]:
        """The instance's buffers by name, for inspection (tests, tools): what ``dispatch`` and ``combine``
        return (``experts``, ``scales`` with FP8, ``combined``) and the Lamport buffers that rest between
        calls (``lamport_partials``: the latency combine's; with packets ``packet_rows``, ``packet_scales``,
        ``packet_weights``, ``copies``: the one-kernel dispatch's). Only the buffers this instance has."""
        return self.memory.named(self.plan.packets)

    def dispatch_path(self, tokens_bound: int | None = None) -> tuple[str, MoEShape]:
        """The kernels a dispatch given ``tokens_bound`` launches and their launch shape (the same on
        every rank for the same bound): ``"one-kernel"`` (``onekernel.py``), ``"routed"`` (the route
        and send kernels), ``"routed-direct"`` (the same, the rows sent into the peers' slots:
        ``MoEShape.direct_from_bytes``) or ``"send-gather"`` (the send and gather kernels)."""
        p = self.plan
        bound = self.max_tokens if tokens_bound is None else tokens_bound
        if p.one or (self.memory.copy is not None and tokens_bound is not None
                     and tokens_bound * self.top_k <= self.shape.one_kernel_entries):
            return "one-kernel", self.decode_shape if p.decode_call(bound) else self.shape
        if not p.routed:
            return "send-gather", self.shape
        direct = p.direct and bound * p.row_bytes >= self.shape.direct_from_bytes
        return ("routed-direct" if direct else "routed"), self.shape

    def trace_stages(self, on: bool = True, calls: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Turn stage stamps on (or off) for later calls: the one-kernel dispatch, the combine and the
        route and send kernels (the routed dispatch: ``route.ROUTED_STAGES``, the route kernel's
        then the send kernel's) then store, per program, a (global timer ns, SM cycles) pair at each
        of their stages (``kernels.stamp``; ``onekernel.DISPATCH_STAGES``,
        ``combine.COMBINE_STAGES``) into the three int64 tensors returned, ``[calls, programs,
        stages, 2]``: the ``i``-th dispatch from now (counting from 0) and its combine into row ``i %
        calls``, so that a CUDA graph of ``calls`` calls captured next keeps every call's stamps. For
        finding where the time goes (``benchmarks/experiments/moe_trace.py``, ``moe_stalls.py``); the
        traced kernels are other builds. Not for the launch path: it allocates, and traced calls
        take a view of a row."""
        if calls < 1:
            raise InvalidInputError(f"moe trace_stages: calls must be at least 1, got {calls}")
        programs, dev = self.shape.programs, self.comm.device
        self._traces = (torch.zeros(calls, programs, DISPATCH_STAGES, 2, dtype=torch.int64, device=dev),
                        torch.zeros(calls, programs, COMBINE_STAGES, 2, dtype=torch.int64, device=dev),
                        torch.zeros(calls, programs, ROUTED_STAGES, 2, dtype=torch.int64, device=dev)) if on else None
        self._trace_from = self._call
        return self._traces

    def _trace(self, kind: int, call: int) -> torch.Tensor | None:
        """Row of stamps ``kind`` (0: one-kernel dispatch, 1: combine, 2: routed dispatch) for the
        dispatch counted ``call`` (``self._call`` before it) and its combine, or None untraced."""
        if self._traces is None:
            return None
        t = self._traces[kind]
        return t[(call - self._trace_from) % t.shape[0]]

    def dropped(self) -> int:
        """Entries dropped so far on this rank's experts because their slots were full (read from the last dispatch
        that finished; host-side, no synchronisation)."""
        return self.memory.bad_host.read()[1]

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 tokens_bound: int | None = None) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                                                           torch.Tensor, MoEHandle]:
        """See the package docstring. Collective. ``tokens_bound``: a bound on every rank's token
        count in this call, **the same on every rank** (a decode step's batch, say); with
        ``tokens_bound * top_k`` at most ``MoEShape.one_kernel_entries`` an instance sized for more tokens
        dispatches in one kernel, as decode-sized ones always do."""
        n = self._check(x, topk_ids, topk_weights)
        if tokens_bound is not None and (not isinstance(tokens_bound, int) or not n <= tokens_bound <= self.max_tokens):
            raise InvalidInputError(f"moe dispatch: tokens_bound must be an int in [{n}, {self.max_tokens}] (this "
                                    f"rank's tokens to max_tokens), got {tokens_bound!r}")
        self.check()
        path, sh = self.dispatch_path(tokens_bound)
        bound = self.max_tokens if tokens_bound is None else tokens_bound  # the same on every rank
        self._debug_check("moe_dispatch", bound)
        sig = self._signature(bound, path)
        if path == "one-kernel":
            self._one.launch(x, topk_ids, topk_weights, shape=sh, bound=bound, sig=sig,
                             trace=self._trace(0, self._call))
        else:
            self._two.launch(x, topk_ids, topk_weights, direct=path == "routed-direct",
                             interleave=self.plan.interleave and bound >= sh.interleave_from, sig=sig,
                             trace=self._trace(2, self._call))
        self._call += 1
        self._open_handle = self._call
        b = self.memory
        return (b.out, b.scales) if self.fp8 else b.out, b.counts, MoEHandle(n, self._call, bound)

    def combine(self, y: torch.Tensor, handle: MoEHandle) -> torch.Tensor:
        """See the package docstring. Collective. Returns ``[n_tokens, hidden]`` (reused by the next call)."""
        if not isinstance(handle, MoEHandle) or handle.call != self._open_handle:
            raise InvalidInputError("moe combine: the handle is not the latest dispatch's, or was combined already")
        shape = (self.local_experts, self.capacity, self.hidden)
        if tuple(y.shape) != shape or y.dtype != self.dtype or y.device != self.comm.device:
            raise InvalidInputError(f"moe combine: y must be {self.dtype} {list(shape)} on {self.comm.device}, got "
                                    f"{y.dtype} {list(y.shape)} on {y.device}")
        self.check()
        self._debug_check("moe_combine", handle.bound)
        self._open_handle = -1
        if y.data_ptr() != self.memory.ybuf.data_ptr():
            self.memory.ybuf.copy_(y)
        out = self._combine.launch(handle.n_tokens, handle.bound, self._trace(1, handle.call - 1))
        return out[:handle.n_tokens]

    def check(self) -> None:
        """Raise ``TritonCommError`` once closed, ``CommTimeoutError`` once a wait expired (host-only)."""
        if self._closed:
            raise TritonCommError("MoEAllToAll is closed")
        self.comm.check()

    def _signature(self, bound: int, path: str) -> int | None:
        """The dispatch's signature, which its kernels compare across ranks (``onekernel.py`` and
        ``dispatch.py``, "Call check"): the op, dtype, the token bound every rank shares and the path;
        None where the communicator's ``check_calls`` is off."""
        if not self.comm.config.check_calls:
            return None
        return pack_signature(OP_CODES["moe_dispatch"], DTYPE_CODES[DTYPE_NAMES[self.dtype]], bound,
                              DISPATCH_PATHS.index(path) + 1)

    def _debug_check(self, op: str, bound: int) -> None:
        """Debug mode (``CommConfig.debug``): every rank must make the same call (dispatch or combine, with
        the same token bound: the count every rank shares, ``tokens_bound`` or ``max_tokens``), of this
        instance's dtype and hidden size (in the algorithm field). Token counts may differ by rank."""
        if self.comm.config.debug:
            self.comm.debug_check(OP_CODES[op], DTYPE_CODES[DTYPE_NAMES[self.dtype]], bound, self.hidden)

    def close(self) -> None:
        """Collective: release the heap memory and channels. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.memory.free()

    # -- checks before any rank waits --------------------------------------------------------------
    def _check(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> int:
        self.check()  # first: a closed instance's host counters are gone
        bad_ids = self.memory.bad_host.read()[0] - self._bad_reported  # a cumulative count
        if bad_ids:
            self._bad_reported += bad_ids
            raise InvalidInputError(f"moe dispatch (rank {self.rank}): {bad_ids} expert ids outside "
                                    f"[0, {self.num_experts}) in an earlier call were dropped")
        dev = self.comm.device
        if x.dim() != 2 or x.shape[1] != self.hidden or x.dtype != self.dtype or x.device != dev \
                or x.stride(1) != 1:
            raise InvalidInputError(f"moe dispatch: x must be {self.dtype} [T, {self.hidden}] on {dev} with unit "
                                    f"column stride, got {x.dtype} {list(x.shape)} on {x.device}")
        n = x.shape[0]
        if n > self.max_tokens:
            raise InvalidInputError(f"moe dispatch: {n} tokens exceed max_tokens {self.max_tokens}")
        if tuple(ids.shape) != (n, self.top_k) or ids.dtype not in (torch.int32, torch.int64) or ids.device != dev:
            raise InvalidInputError(f"moe dispatch: topk_ids must be int32/int64 [{n}, {self.top_k}] on {dev}, got "
                                    f"{ids.dtype} {list(ids.shape)} on {ids.device}")
        if tuple(weights.shape) != (n, self.top_k) or not weights.is_floating_point() or weights.device != dev:
            raise InvalidInputError(f"moe dispatch: topk_weights must be floating [{n}, {self.top_k}] on {dev}, got "
                                    f"{weights.dtype} {list(weights.shape)} on {weights.device}")
        return n
