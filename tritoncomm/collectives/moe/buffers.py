"""The memory of a ``MoEAllToAll``: its heap buffers (peers store into them), its three channels and
its local tensors (what a dispatch leaves its combine), laid out from its plan (``plan.py``).

Heap buffers that the send's epoch parity alternates have two halves (``halves``: the heap offset
and the bytes of one half, the kernels' arguments). Allocation is collective and follows one order
on every rank: the heap offsets are the same everywhere."""

from __future__ import annotations

import torch

from ...channels import HEAP_ALIGN, Channel, Communicator
from ...channels.cuda_ipc import HostMappedWords
from ...kernels import barrier_flag_bytes, lamport_fill, pow2_at_least
from ...units import round_up
from .plan import MoEPlan, device_facts
from .shape import MoEShape, default_prefill_from, default_shape

__all__ = ["MoEBuffers", "heap_bytes_bound", "halves"]


def halves(comm: Communicator, t: torch.Tensor | None) -> tuple[int, int]:
    """Heap offset of a two-half buffer and the bytes of one half; ``(0, 0)`` for none."""
    if t is None:
        return 0, 0
    return comm.heap_offset(t), t[0].numel() * t.element_size()


class MoEBuffers:
    """Every buffer of one instance (see the module docstring). Creating it is collective (the
    channels); so is ``free``."""

    def __init__(self, comm: Communicator, plan: MoEPlan, name: str) -> None:
        p, sh = plan, plan.shape
        w, m, k, hidden, wire = p.world, p.max_tokens, p.top_k, p.hidden, p.wire
        dev = comm.device
        self.comm = comm
        pr = p.peers * p.packet_rows
        # -- the one-kernel (and routed-packet) dispatch's packet buffers: per half the peers' rows,
        #    their scales and weights (Lamport, at rest between calls)
        self.precv = comm.empty((2, pr, hidden), wire) if p.packets else None
        self.psc = comm.empty((2, pr, hidden // 128), torch.float32) if p.packets and p.fp8 else None
        self.pw = comm.empty((2, pr * k), torch.float32) if p.packets else None
        # -- the plain receive buffer, the tables of ids, weights and token counts
        self.recv = comm.empty((2, p.peers * m, hidden), wire) if p.plain else None
        self.ids = comm.empty((2, w * m * k), torch.int32)
        self.wtab = comm.empty((2, w * m * k), torch.float32)
        self.ntab = comm.empty((2, w), torch.int32)
        #: per block of block_e entries of every source and per superblock, its count per expert (route.py)
        self.hist = None if p.one else comm.empty((2, w * (p.hist_blocks + p.supers), p.block_x), torch.int32)
        #: the one-kernel dispatch's routing copies, one per program (the shared copy is program 0's)
        self.copy = comm.empty((2, sh.programs * w * p.block_n), torch.int32) if sh.one_kernel else None
        #: the one-kernel packet dispatch's call check: an int64 header per (program, source), 0 at rest
        self.hdrs = comm.empty((2, p.header_programs * w), torch.int64) if sh.one_kernel and p.packets else None
        if self.hdrs is not None:
            self.hdrs.zero_()
        #: for calls with the shared copy: per half, the programs of the running launch done with the copies
        self.readers = torch.zeros(2, dtype=torch.int32, device=dev) if p.packets else None
        self.sc = comm.empty((2, p.peers * m, hidden // 128), torch.float32) if p.fp8 and p.plain else None
        for t in (self.precv, self.psc, self.pw, self.copy if p.packets else None):
            if t is not None:  # at rest before the channels below are created: see there
                lamport_fill(t)
        # -- the combine: the expert outputs, the throughput mode's partials, the latency mode's
        #    Lamport buffer (a row per peer and token of a call below the switch, at rest)
        self.ybuf = comm.empty((p.local_experts, p.capacity, hidden), p.dtype)
        self.part = comm.empty((w, m, hidden), p.dtype) if p.has_partials else None
        self.lpart = comm.empty((w, p.lamport_rows, hidden), p.dtype) if p.lamport_rows > 0 else None
        if self.lpart is not None:
            lamport_fill(self.lpart)
        # The Lamport buffers are at rest before any peer writes them: creating a channel synchronises
        # the device and ends with a check that every rank passes (channels/channel.py).
        programs = sh.programs
        #: interleaved: a half slot each too
        self.send_ch = Channel(comm, f"{name}.send", programs=programs,
                               barrier_slots=2 * programs if p.interleave else programs)
        #: the throughput combine interleaved or chunked: a half slot or a progress slot each too
        self.comb_ch = Channel(comm, f"{name}.combine", programs=programs,
                               barrier_slots=2 * programs if p.combine_interleave or p.combine_chunks else programs)
        self.route_ch = Channel(comm, f"{name}.route", programs=programs,
                                barrier_slots=programs if p.route_barrier or p.direct else 0) if p.routed else None
        # -- local: per own entry its expert's rank (or -1) and its expert-buffer row (local expert *
        #    capacity + slot, or -1); per entry of a local expert its expert-buffer row or -1
        i32 = dict(dtype=torch.int32, device=dev)
        self.owner = torch.empty(m, k, **i32)
        self.row = torch.empty(m, k, **i32)
        self.slot_of = torch.empty(w * m * k, **i32)
        self.weights = torch.empty(m, k, dtype=torch.float32, device=dev)
        self.counts = torch.empty(p.local_experts, **i32)
        #: the expert buffer (dispatch's result) and its scales: in the heap where peers store into it
        xe = (p.local_experts, p.capacity, hidden)
        self.out = comm.empty(xe, wire) if p.direct else torch.empty(xe, dtype=wire, device=dev)
        xs = (*xe[:2], hidden // 128)
        self.scales = (comm.empty(xs, torch.float32) if p.direct else
                       torch.empty(xs, dtype=torch.float32, device=dev)) if p.fp8 else None
        self.combined = torch.empty(m, hidden, dtype=p.dtype, device=dev)
        #: ids out of range, entries dropped on own experts; then both as last copied into ``bad_host``
        self.bad = torch.zeros(4, dtype=torch.int64, device=dev)
        self.bad_host = HostMappedWords(2, comm.backend == "cuda")  # bad[:2] as last copied by a dispatch
        #: what each dispatch leaves its combine (``header.py``): every rank's tokens, the tables' half
        self.header = torch.zeros(2 * pow2_at_least(w), dtype=torch.int32, device=dev)
        self._direct = p.direct

    def offset(self, t: torch.Tensor | None) -> int:
        """A one-piece heap buffer's offset, 0 for none."""
        return self.comm.heap_offset(t) if t is not None else 0

    def halves(self, t: torch.Tensor | None) -> tuple[int, int]:
        """A two-half heap buffer's offset and bytes per half (``halves``)."""
        return halves(self.comm, t)

    def packet_args(self) -> dict[str, int]:
        """The packet buffers' offsets and half sizes, as the dispatch kernels take them."""
        (p_off, p_half), (ps_off, ps_half), (pw_off, pw_half) = (self.halves(t) for t in (self.precv, self.psc,
                                                                                         self.pw))
        return dict(recv_off=p_off, recv_half=p_half, sc_off=ps_off, sc_half=ps_half, pw_off=pw_off, pw_half=pw_half)

    def plain_args(self) -> dict[str, int]:
        """The plain receive buffer's and its scales' offsets and half sizes (no packet weights)."""
        (r_off, r_half), (s_off, s_half) = self.halves(self.recv), self.halves(self.sc)
        return dict(recv_off=r_off, recv_half=r_half, sc_off=s_off, sc_half=s_half, pw_off=0, pw_half=0)

    def named(self, packets: bool) -> dict[str, torch.Tensor]:
        """The buffers ``MoEAllToAll.buffers`` names (only those this instance has)."""
        named = {"experts": self.out, "scales": self.scales, "combined": self.combined,
                 "lamport_partials": self.lpart, "packet_rows": self.precv, "packet_scales": self.psc,
                 "packet_weights": self.pw, "copies": self.copy if packets else None}
        return {name: t for name, t in named.items() if t is not None}

    def free(self) -> None:
        """Collective: close the channels and give the heap buffers back."""
        for ch in (self.send_ch, self.comb_ch, self.route_ch):
            if ch is not None:
                ch.close()
        for t in (self.recv, self.ids, self.wtab, self.ntab, self.hist, self.copy, self.hdrs, self.ybuf,
                  self.sc, self.part, self.lpart, self.precv, self.psc, self.pw,
                  *((self.out, self.scales) if self._direct else ())):
            if t is not None:
                self.comm.free(t)
        self.bad_host.close()


def heap_bytes_bound(backend: str, device: torch.device, world: int, *, max_tokens: int, hidden: int,
                     num_experts: int, top_k: int, dtype: torch.dtype = torch.bfloat16, capacity: int | None = None,
                     fp8_dispatch: bool = False, prefill_from: int | None = None,
                     shape: MoEShape | None = None) -> int:
    """An upper bound of the heap bytes a ``MoEAllToAll`` of these arguments takes from its
    communicator (at ``world`` ranks on ``backend``/``device``): every buffer any of its paths may
    allocate and its three channels' slots, each rounded to the heap's alignment. For sizing a
    communicator that holds one instance; not for the launch path."""
    sms, switches = device_facts(backend, device, world) if shape is None else (1, {})
    if prefill_from is None:
        prefill_from = default_prefill_from(switches)
    sh = shape or default_shape(backend, max_tokens, sms, prefill_from, hidden, 1 if fp8_dispatch else dtype.itemsize,
                                world, switches)
    m, k, w, el = max_tokens, top_k, world, dtype.itemsize
    wire = 1 if fp8_dispatch else el
    peers, local = max(w - 1, 1), num_experts // max(w, 1)
    cap = capacity if capacity is not None else w * m
    block_e = max(sh.block_e, pow2_at_least(k))
    blocks = -(-m * k // block_e)
    scales = hidden // 128 * 4 if fp8_dispatch else 0
    sizes = [
        2 * 2 * peers * m * (hidden * wire + scales),  # the packet and the plain receive buffers
        2 * peers * m * k * 4,  # the packets' weights
        2 * 2 * w * m * k * 4 + 2 * w * 4,  # the ids and weights tables, the token counts
        2 * w * (blocks + -(-blocks // sh.super_blocks)) * max(pow2_at_least(num_experts), 4) * 4,  # histograms
        2 * sh.programs * w * min(pow2_at_least(m * k), sh.one_kernel_entries) * 4,  # the routing copies
        2 * sh.programs * w * 8,  # the one-kernel dispatch's call-check headers (a decode shape has fewer programs)
        local * cap * (hidden * el + hidden * wire + scales),  # the expert buffer, the direct rows and scales
        2 * w * m * hidden * el,  # the partials and the Lamport partials
    ]
    # three channels (``Channel``): an epoch per program, flags for up to two barrier slots per program
    sizes += [4 * sh.programs, barrier_flag_bytes(2 * sh.programs)] * 3
    return sum(round_up(max(b, 1), HEAP_ALIGN) for b in sizes)
