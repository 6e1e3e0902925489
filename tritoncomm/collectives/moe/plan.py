"""What a ``MoEAllToAll`` decides once, at set-up, from its arguments and launch shape: which
dispatch paths its calls may take, which buffers they need and how many rows each holds. Every
rank decides alike (the decisions depend only on arguments every rank shares), so the heap
(``buffers.py``) and the launches (``launches.py``) pair across ranks. Nothing here allocates."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from ...errors import InvalidInputError
from ...kernels import pow2_at_least
from ..selection import read_table
from .shape import MoEShape, default_prefill_from, default_shape, default_throughput_from

__all__ = ["MODES", "MoEPlan", "device_facts", "plan_instance"]

MODES = ("auto", "latency", "throughput")


def device_facts(backend: str, device: torch.device | None, world: int) -> tuple[int, dict[str, int]]:
    """What the default launch shapes depend on: ``device``'s SM count and its table's MoE switch points
    at ``world`` ranks (``MOE_SWITCHES``; 1 and none in the CPU world)."""
    if backend != "cuda":
        return 1, {}
    switches = read_table(backend, torch.cuda.get_device_name(device)).switches_for("moe", world)
    return torch.cuda.get_device_properties(device).multi_processor_count, dict(switches)


def _positive(what: str, v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InvalidInputError(f"MoEAllToAll: {what} must be a positive int, got {v!r}")


def _at_least(what: str, v: object, lowest: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lowest:
        raise InvalidInputError(f"MoEAllToAll: {what} must be an int >= {lowest}, got {v!r}")


@dataclass(frozen=True)
class MoEPlan:
    """An instance's set-up decisions (``plan_instance``), grouped as the module docstring says. The
    derived ones are computed once, at their first use (``cached_property``), so calls only read them."""

    # -- the problem
    world: int
    max_tokens: int
    hidden: int
    num_experts: int
    top_k: int
    dtype: torch.dtype
    capacity: int
    fp8: bool
    # -- the launch shapes and the switches between them
    shape: MoEShape
    decode_shape: MoEShape | None
    decode_below: int
    mode: str
    #: combine's switch, in total tokens per call (the kernel's runtime argument); at world 1 the
    #: owners are the callers, so the throughput mode would only add a pass
    throughput_from: int

    @cached_property
    def local_experts(self) -> int:
        return self.num_experts // self.world

    @cached_property
    def peers(self) -> int:
        """Peers' rows a receive buffer holds room for (1 at world 1)."""
        return max(self.world - 1, 1)

    @cached_property
    def wire(self) -> torch.dtype:
        """The dtype token rows travel in."""
        return torch.float8_e4m3fn if self.fp8 else self.dtype

    @cached_property
    def row_bytes(self) -> int:
        """Bytes per token row on the wire."""
        return self.hidden * (1 if self.fp8 else self.dtype.itemsize)

    # -- the dispatch paths this instance may take
    @cached_property
    def one(self) -> bool:
        """Every call dispatches in one kernel."""
        return self.shape.one_kernel and self.max_tokens * self.top_k <= self.shape.one_kernel_entries

    @cached_property
    def routed(self) -> bool:
        """Calls not in one kernel start with the route kernel (else the send and gather kernels)."""
        return not self.one and self.max_tokens * self.top_k > self.shape.route_above

    @cached_property
    def routed_packets(self) -> bool:
        """The routed calls' rows travel as packets too (``MoEShape.routed_packets``): the packet
        buffers then hold every row of a call, and the plain receive buffer is not needed."""
        return self.shape.packets and self.shape.routed_packets and self.routed

    @cached_property
    def packets(self) -> bool:
        """The instance has packet buffers (Lamport, at rest between calls)."""
        return (self.shape.one_kernel and self.shape.packets) or self.routed_packets

    @cached_property
    def packet_rows(self) -> int:
        """Rows per peer of the packet buffers."""
        if self.routed_packets:
            return self.max_tokens
        return min(self.max_tokens, self.shape.one_kernel_entries // self.top_k) if self.packets else 0

    @cached_property
    def plain(self) -> bool:
        """Some calls take the plain receive buffer."""
        return not ((self.one or self.routed_packets) and self.packets)

    @cached_property
    def direct(self) -> bool:
        """Some calls send their rows straight into the peers' expert slots (``direct_from_bytes``);
        the expert buffer is then in the heap."""
        return self.routed and not self.routed_packets and \
            self.shape.direct_from_bytes <= self.max_tokens * self.row_bytes

    @cached_property
    def interleave(self) -> bool:
        """Some calls interleave the routed send kernel's sends and layout (``interleave_from``)."""
        return self.routed and not self.routed_packets and self.shape.interleave_from <= self.max_tokens

    @cached_property
    def pairs(self) -> bool:
        """The paired layout's code, only where sources can give every program two rows."""
        return self.shape.paired_layout and self.max_tokens >= 2 * self.shape.programs

    @cached_property
    def route_barrier(self) -> bool:
        """The route kernel ends with a barrier of its own (``MoEShape.route_barrier``; routed packets
        need it)."""
        return self.shape.route_barrier or self.routed_packets

    # -- the routing tables (``route.py``, ``onekernel.py``)
    @cached_property
    def block_x(self) -> int:
        """The histograms' width (``BLOCK_X``)."""
        return max(pow2_at_least(self.num_experts), 4)

    @cached_property
    def hist_blocks(self) -> int:
        """Routing blocks of ``block_e`` entries per source."""
        return -(-self.max_tokens * self.top_k // self.shape.block_e)

    @cached_property
    def supers(self) -> int:
        return -(-self.hist_blocks // self.shape.super_blocks)

    @cached_property
    def block_n(self) -> int:
        """Entries of a one-kernel routing copy."""
        return min(pow2_at_least(self.max_tokens * self.top_k), self.shape.one_kernel_entries)

    @cached_property
    def held_block_n(self) -> int:
        """Entries of the routing that every send program holds on the send-gather path."""
        return pow2_at_least(self.max_tokens * self.top_k)

    @cached_property
    def header_programs(self) -> int:
        """Programs of the widest one-kernel launch (each has a call-check header per source)."""
        return max(self.shape.programs, self.decode_shape.programs if self.decode_shape is not None else 0)

    # -- the combine
    @cached_property
    def has_partials(self) -> bool:
        """Some calls take the throughput mode's partials buffer."""
        return self.throughput_from <= self.world * self.max_tokens

    @cached_property
    def lamport_rows(self) -> int:
        """The latency mode's Lamport buffer: rows per peer (tokens of a call below the switch)."""
        return min(self.max_tokens, self.throughput_from - 1) if self.world > 1 else 0

    @cached_property
    def combine_interleave(self) -> bool:
        """Some calls interleave the throughput combine (``combine_interleave_from``)."""
        return self.world > 1 and self.shape.combine_interleave_from <= self.max_tokens

    @cached_property
    def combine_chunks(self) -> int:
        """The throughput combine's chunks without its barrier (``combine_chunks``), 0: none."""
        return self.shape.combine_chunks if self.world > 1 else 0

    def decode_call(self, bound: int) -> bool:
        """Whether a call of at most ``bound`` tokens per rank (the same on every rank) launches with
        ``decode_shape``: a one-kernel call below ``decode_below`` on an instance that has one."""
        return (self.decode_shape is not None and bound < self.decode_below
                and bound * self.top_k <= self.shape.one_kernel_entries)


def _fitted(sh: MoEShape, top_k: int, fp8: bool) -> MoEShape:
    """``sh`` with whole FP8 scale groups per step and a row's entries within two routing blocks
    (``route.row_slots``)."""
    if fp8:
        sh = replace(sh, block_h=max(sh.block_h, 128), send_block_h=sh.send_block_h and max(sh.send_block_h, 128),
                     one_block_h=sh.one_block_h and max(sh.one_block_h, 128))
    return replace(sh, block_e=max(sh.block_e, pow2_at_least(top_k)))


def plan_instance(backend: str, world: int, sms: int, switches: dict[str, int], *, max_tokens: int, hidden: int,
                  num_experts: int, top_k: int, dtype: torch.dtype, capacity: int | None, fp8_dispatch: bool,
                  mode: str, throughput_from: int | None, prefill_from: int | None, shape: MoEShape | None,
                  decode_shape: MoEShape | None, decode_below: int | None) -> MoEPlan:
    """``MoEAllToAll``'s arguments checked (``InvalidInputError`` before anything is allocated) and
    resolved against the device's facts (``sms`` and its table's MoE ``switches`` at ``world``
    ranks on ``backend``) into its plan."""
    for what, v in (("max_tokens", max_tokens), ("hidden", hidden), ("num_experts", num_experts), ("top_k", top_k)):
        _positive(what, v)
    if num_experts % world:
        raise InvalidInputError(f"MoEAllToAll: {num_experts} experts do not split evenly over {world} ranks")
    if top_k > num_experts:
        raise InvalidInputError(f"MoEAllToAll: top_k {top_k} exceeds {num_experts} experts")
    if mode not in MODES:
        raise InvalidInputError(f"MoEAllToAll: mode must be one of {MODES}, got {mode!r}")
    throughput_from = default_throughput_from(world, hidden, switches) if throughput_from is None else throughput_from
    prefill_from = default_prefill_from(switches) if prefill_from is None else prefill_from
    _at_least("throughput_from", throughput_from, 0)
    _at_least("prefill_from", prefill_from, 1)
    decode_below = prefill_from if decode_below is None else decode_below
    _at_least("decode_below", decode_below, 0)
    if dtype not in (torch.bfloat16, torch.float16):
        raise InvalidInputError(f"MoEAllToAll: dtype must be bf16 or fp16, got {dtype}")
    capacity = world * max_tokens if capacity is None else capacity
    if not isinstance(capacity, int) or capacity < 1:
        raise InvalidInputError(f"MoEAllToAll: capacity must be a positive int, got {capacity!r}")
    if fp8_dispatch and hidden % 128:
        raise InvalidInputError(f"MoEAllToAll: FP8 dispatch needs hidden a multiple of 128, got {hidden}")
    if shape is not None and not isinstance(shape, MoEShape):
        raise InvalidInputError(f"MoEAllToAll: shape must be a MoEShape, got {shape!r}")
    sh = shape or default_shape(backend, max_tokens, sms, prefill_from, hidden,
                                1 if fp8_dispatch else dtype.itemsize, world, switches)
    if decode_shape is None and shape is None and max_tokens >= prefill_from:
        decode_shape = default_shape(backend, prefill_from - 1, sms, prefill_from, world=world)
        decode_shape = decode_shape if decode_shape != sh else None  # the CPU world has one shape
    if decode_shape is not None and (not isinstance(decode_shape, MoEShape) or not decode_shape.one_kernel
                                     or decode_shape.programs > sh.programs
                                     or decode_shape.packets != sh.packets or not sh.one_kernel):
        raise InvalidInputError(f"MoEAllToAll: decode_shape must be a one-kernel MoEShape with packets as the "
                                f"instance's ({sh.packets}) and at most its {sh.programs} programs, on a "
                                f"one-kernel instance shape; got {decode_shape!r}")
    fp8 = bool(fp8_dispatch)
    every = world * max_tokens + 1  # a total no call reaches
    return MoEPlan(world=world, max_tokens=max_tokens, hidden=hidden, num_experts=num_experts, top_k=top_k,
                   dtype=dtype, capacity=capacity, fp8=fp8, shape=_fitted(sh, top_k, fp8),
                   decode_shape=_fitted(decode_shape, top_k, fp8) if decode_shape is not None else None,
                   decode_below=decode_below, mode=mode,
                   throughput_from={"auto": throughput_from if world > 1 else every, "latency": every,
                                    "throughput": 0}[mode])
