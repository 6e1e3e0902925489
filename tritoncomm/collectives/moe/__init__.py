"""Mixture-of-experts dispatch and combine over the symmetric heap (expert parallelism).

``MoEAllToAll`` (collective to create, once per communicator): ``num_experts`` experts split evenly
over the ranks (expert ``e`` on rank ``e // local_experts``), up to ``max_tokens`` tokens per rank and
call, ``top_k`` experts per token.

* ``dispatch(x, topk_ids, topk_weights)``: every rank's routing is all-gathered (ids only, ``max_tokens
  * top_k`` int32 per rank), so every rank computes the same slots: the entries ``(source rank, token,
  j)`` of expert ``e`` in that order get slots ``0, 1, ...``; entries past ``capacity`` are dropped.
  Each token then goes once to each rank that holds one of its experts (``moe_send_kernel``), and each
  rank copies its received tokens into ``[local_experts, capacity, hidden]`` (``moe_layout_kernel``).
  Returns that tensor (rows past ``counts[e]`` are undefined), ``counts`` (int32, on the device) and a
  handle for ``combine``.
* ``combine(y, handle)``: ``y [local_experts, capacity, hidden]`` (write it into ``expert_buffer()`` to
  skip a copy); returns ``out[t] = sum_j topk_weights[t, j] * y_owner[expert, slot]`` accumulated in
  fp32 in ``j`` order, so the bits never depend on arrival order.

No host synchronisation: routing stays on the device, so both calls can be captured in CUDA graphs
and replayed with new routing. Expert ids outside ``[0, num_experts)`` are dropped on the device and
reported by an error at the next ``dispatch`` (like the wait diagnostics); every write stays in bounds.
The tensors ``dispatch`` returns are reused by the next call; a handle serves one ``combine``, and
``dispatch`` and ``combine`` alternate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...channels import Channel, Communicator
from ...errors import InvalidInputError
from ..allgather import AllGather
from .combine import launch_combine
from .dispatch import launch_layout, launch_send

__all__ = ["MoEAllToAll", "MoEHandle"]

#: Launch shape per backend: (programs, column block, warps).
SHAPES = {"cuda": (64, 1024, 4), "cpu": (2, 64, 1)}


@dataclass(frozen=True)
class MoEHandle:
    """What ``combine`` needs from its ``dispatch``: the token count and the call it came from."""

    n_tokens: int
    call: int


class MoEAllToAll:
    """See the module docstring."""

    def __init__(self, comm: Communicator, *, max_tokens: int, hidden: int, num_experts: int, top_k: int,
                 dtype: torch.dtype = torch.bfloat16, capacity: int | None = None, name: str = "moe") -> None:
        w = comm.world
        for what, v in (("max_tokens", max_tokens), ("hidden", hidden), ("num_experts", num_experts),
                        ("top_k", top_k)):
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"MoEAllToAll: {what} must be a positive int, got {v!r}")
        if num_experts % w:
            raise InvalidInputError(f"MoEAllToAll: {num_experts} experts do not split evenly over {w} ranks")
        if top_k > num_experts:
            raise InvalidInputError(f"MoEAllToAll: top_k {top_k} exceeds {num_experts} experts")
        if dtype not in (torch.bfloat16, torch.float16):
            raise InvalidInputError(f"MoEAllToAll: dtype must be bf16 or fp16, got {dtype}")
        self.comm, self.world, self.rank = comm, w, comm.rank
        self.max_tokens, self.hidden, self.num_experts, self.top_k, self.dtype = (max_tokens, hidden, num_experts,
                                                                                  top_k, dtype)
        self.local_experts = num_experts // w
        self.capacity = capacity if capacity is not None else w * max_tokens
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise InvalidInputError(f"MoEAllToAll: capacity must be a positive int, got {capacity!r}")
        self.programs, self.block_h, self.num_warps = SHAPES[comm.backend]
        dev, m, k, n_entries = comm.device, max_tokens, top_k, w * max_tokens * top_k
        self._ids_ag = AllGather(comm, max_bytes=n_entries * 4, name=f"{name}.ids")
        self._recv = comm.empty((2, w * m, hidden), dtype)  # two halves: the send's epoch parity
        self._recv_off = comm.heap_offset(self._recv)
        self._half_bytes = w * m * hidden * dtype.itemsize
        self._ybuf = comm.empty((self.local_experts, self.capacity, hidden), dtype)
        self._ybuf_off = comm.heap_offset(self._ybuf)
        self._send_ch = Channel(comm, f"{name}.send", programs=self.programs, barrier_slots=self.programs)
        self._comb_ch = Channel(comm, f"{name}.combine", programs=self.programs, barrier_slots=self.programs)
        i32 = dict(dtype=torch.int32, device=dev)
        self._ids = torch.empty(m, k, **i32)
        self._ids_all = torch.empty(n_entries, **i32)
        self._entry = torch.arange(n_entries, device=dev)
        self._ranks = torch.arange(w, device=dev, dtype=torch.int32)
        self._dst = torch.empty(n_entries, **i32)
        self._owner = torch.empty(m, k, **i32)
        self._row = torch.empty(m, k, **i32)
        self._dest = torch.empty(m, w, dtype=torch.int8, device=dev)
        self._weights = torch.zeros(m, k, dtype=torch.float32, device=dev)
        self._counts = torch.empty(self.local_experts, **i32)
        self._out = torch.empty(self.local_experts, self.capacity, hidden, dtype=dtype, device=dev)
        self._combined = torch.empty(m, hidden, dtype=dtype, device=dev)
        self._bad = torch.zeros(2, dtype=torch.int64, device=dev)  # ids out of range, entries past capacity
        self._bad_host = torch.zeros(2, dtype=torch.int64, pin_memory=comm.backend == "cuda")
        self._call = 0
        self._open_handle = -1

    # -- what callers use ------------------------------------------------------------------------
    def expert_buffer(self) -> torch.Tensor:
        """``[local_experts, capacity, hidden]`` in the heap: experts that write their outputs here
        spare ``combine`` a copy. Written by ``combine`` (as its copy) and read by peers during it."""
        return self._ybuf

    def dropped(self) -> int:
        """Entries dropped so far because an expert's slots were full (read from the last dispatch
        that finished; host-side, no synchronisation)."""
        return int(self._bad_host[1])

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, MoEHandle]:
        """See the module docstring. Collective."""
        n = self._check(x, topk_ids, topk_weights)
        self.comm.check()
        k, m, experts, local, cap = self.top_k, self.max_tokens, self.num_experts, self.local_experts, self.capacity
        ids = self._ids
        ids.fill_(-1)
        ids[:n].copy_(topk_ids)
        real = ids[:n]
        bad = (real < 0) | (real >= experts)
        self._bad[0] += bad.sum()
        real.masked_fill_(bad, -1)
        self._weights[:n].copy_(topk_weights)
        self._ids_ag(ids.view(-1).view(torch.float32), self._ids_all.view(torch.float32))  # a copy: bits kept
        # Slots, the same on every rank: entries in (source, token, j) order, per expert.
        e = self._ids_all.long()
        bucket = torch.where(e >= 0, e, experts)
        order = torch.sort(bucket, stable=True).indices
        counts = torch.zeros(experts + 1, dtype=torch.int64, device=e.device).scatter_add_(
            0, bucket, torch.ones_like(bucket))
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(order).scatter_(0, order, self._entry)
        slot = pos - starts[bucket]
        ok = (e >= 0) & (slot < cap)
        self._bad[1] += ((e >= 0) & ~ok).sum()
        here = ok & (bucket // local == self.rank)
        self._dst.copy_(torch.where(here, (bucket - self.rank * local) * cap + slot, -1))
        self._counts.copy_(counts[self.rank * local:(self.rank + 1) * local].clamp(max=cap))
        mine = slice(self.rank * m * k, (self.rank + 1) * m * k)
        self._owner.copy_(torch.where(ok[mine], bucket[mine] // local, -1).view(m, k))
        self._row.copy_(torch.where(ok[mine], (bucket[mine] % local) * cap + slot[mine], 0).view(m, k))
        self._dest.copy_((self._owner[:, :, None] == self._ranks).any(1))
        launch_send(self.comm, self._send_ch, x, self._dest, n, m, self._recv_off, self._half_bytes, self.programs,
                    self.block_h, self.num_warps)
        launch_layout(self.comm, self._send_ch, self._out, self._dst, self._recv_off, self._half_bytes, k,
                      self.block_h, self.num_warps)
        self._bad_host.copy_(self._bad, non_blocking=True)
        self._call += 1
        self._open_handle = self._call
        return self._out, self._counts, MoEHandle(n, self._call)

    def combine(self, y: torch.Tensor, handle: MoEHandle) -> torch.Tensor:
        """See the module docstring. Collective. Returns ``[n_tokens, hidden]`` (reused by the next call)."""
        if not isinstance(handle, MoEHandle) or handle.call != self._open_handle:
            raise InvalidInputError("moe combine: the handle is not the latest dispatch's, or was combined already")
        shape = (self.local_experts, self.capacity, self.hidden)
        if tuple(y.shape) != shape or y.dtype != self.dtype or y.device != self.comm.device:
            raise InvalidInputError(f"moe combine: y must be {self.dtype} {list(shape)} on {self.comm.device}, got "
                                    f"{y.dtype} {list(y.shape)} on {y.device}")
        self.comm.check()
        self._open_handle = -1
        if y.data_ptr() != self._ybuf.data_ptr():
            self._ybuf.copy_(y)
        out = self._combined
        launch_combine(self.comm, self._comb_ch, out, self._weights, self._owner, self._row, handle.n_tokens,
                       self._ybuf_off, self.programs, self.block_h, self.num_warps)
        return out[:handle.n_tokens]

    def close(self) -> None:
        """Collective: release the heap memory and channels."""
        self._ids_ag.close()
        for ch in (self._send_ch, self._comb_ch):
            ch.close()
        for t in (self._recv, self._ybuf):
            self.comm.free(t)

    # -- checks before any rank waits --------------------------------------------------------------
    def _check(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> int:
        bad_ids = int(self._bad_host[0])
        if bad_ids:
            self._bad_host[0] = 0
            self._bad[0] = 0
            raise InvalidInputError(f"moe dispatch (rank {self.rank}): {bad_ids} expert ids outside "
                                    f"[0, {self.num_experts}) in an earlier call were dropped")
        dev = self.comm.device
        if x.dim() != 2 or x.shape[1] != self.hidden or x.dtype != self.dtype or x.device != dev \
                or not x.is_contiguous():
            raise InvalidInputError(f"moe dispatch: x must be a contiguous {self.dtype} [T, {self.hidden}] on {dev}, "
                                    f"got {x.dtype} {list(x.shape)} on {x.device}")
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
