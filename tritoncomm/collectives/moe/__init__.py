"""Mixture-of-experts dispatch and combine over the symmetric heap (expert parallelism).

``MoEAllToAll`` (collective to create, once per communicator): ``num_experts`` experts split evenly
over the ranks (expert ``e`` on rank ``e // local_experts``), up to ``max_tokens`` tokens per rank and
call, ``top_k`` experts per token, at most ``capacity`` entries per expert and call.

* ``dispatch(x, topk_ids, topk_weights, tokens_bound=None)``: one kernel for decode-sized instances
  (``MoEShape.one_kernel``: ``onekernel.py``; with ``MoEShape.packets`` its routing, rows and
  weights travel as Lamport packets and it has no barrier) and for calls whose ``tokens_bound``
  (the same on every rank) is small enough, two for the others, all with the same results: a
  token's -0.0 arrives as +0.0 on every path (FP8 too), a weight at the fp32 Lamport sentinel as
  -0.0 (``kernels/lamport.py``). On
  prefill-sized instances ``moe_route_kernel`` sends this rank's routing to every rank, then
  ``moe_send_kernel`` sends each token once to each rank that holds one of its experts, lays out
  this rank's own tokens on its own experts meanwhile, and after its barrier slot lays out the
  peers' tokens (in large calls, ``MoEShape.direct_from_bytes``, each token goes straight into its
  first slot on the peer, which copies it into its other slots); on the smaller ones the send
  kernel carries the routing and ``moe_gather_kernel`` lays out the peers' tokens. The slots are
  the same on every rank, computed without talking (``route.py``: the entries ``(source rank,
  token, j)`` of expert ``e`` get slots ``0, 1, ...`` in the order of their sources relative to
  ``e``'s owner, its own first, then of ``(token, j)``; entries past ``capacity`` are dropped);
  each row is read once and stored once per kept entry into ``[local_experts, capacity, hidden]``.
  Returns that tensor (rows past ``counts[e]`` are undefined), ``counts`` (int32, on the device)
  and a handle for ``combine``. An expert id of -1 means "no expert". With ``fp8_dispatch`` tokens
  travel as e4m3 with one fp32 scale per 128 values (``scale = max(amax, 1e-12) / 448``, computed
  on the device, ``wire.py``) and the first result is ``(values [local_experts, capacity, hidden]
  e4m3, scales [local_experts, capacity, hidden / 128] fp32)``.
* ``combine(y, handle)``: ``y [local_experts, capacity, hidden]`` (write it into ``expert_buffer()`` to
  skip a copy); returns ``out[t] = sum_j topk_weights[t, j] * y_owner[expert, slot]``: per owner rank
  the fp32 sum in ``j`` order rounded to the dtype, those partials summed in fp32 in rank order
  (``combine.py`` states it exactly), so the bits never depend on arrival order nor on the mode.
  Each owner sums its experts' outputs per token and pushes one row per token home, in one of two
  modes chosen on the device per call from the total token count over the ranks: latency (below
  ``throughput_from``: Lamport packets, no barrier) and throughput (bulk stores, then a barrier);
  by default ``throughput_from = default_throughput_from(world, hidden, switches)`` (the device table's).
  ``mode="latency"`` or ``"throughput"`` fixes the mode; ``"latency"`` (and ``"auto"`` at world 1,
  where it always chooses latency) spares the partials buffer (``world * max_tokens * hidden``
  elements of the heap), ``"throughput"`` the Lamport buffer (``world * min(max_tokens,
  throughput_from - 1) * hidden``).

With ``MoEShape.pdl`` (on GPUs from sm_90 on) every kernel is launched with programmatic dependent
launch: it starts while the previous one ends and waits for it (``pdl_wait``) before touching memory.

The launch shape follows the instance's size (``default_shape``: ``max_tokens`` against
``prefill_from``) unless ``shape`` is given; ``tune --op moe`` measures both switches
(``tools/moetune.py``). On an instance sized from ``prefill_from`` on, calls whose ``tokens_bound``
is below ``decode_below`` (by default ``prefill_from``) launch their one-kernel dispatch and their
combine with ``decode_shape`` (by default the shape a decode-sized instance gets: fewer, narrower
programs), on the same buffers and channels.

No host synchronisation: routing stays on the device, so both calls can be captured in CUDA graphs
and replayed with new routing. Other ids outside ``[0, num_experts)`` are dropped on the device and
reported by an error at the first ``dispatch`` after the call that dropped them has finished on the
device (the count reaches the host through host-mapped memory, without a sync); every write stays in
bounds. The tensors ``dispatch`` and ``combine`` return are reused by the next call; a handle serves
one ``combine``, and ``dispatch`` and ``combine`` alternate.

The launch shape (``MoEShape``), the shapes an instance given none takes and the measured defaults
behind them: ``shape.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...channels import HEAP_ALIGN, Channel, Communicator
from ...channels.cuda_ipc import HostMappedWords
from ...errors import InvalidInputError, TritonCommError
from ...kernels import barrier_flag_bytes, lamport_fill, pow2_at_least
from ...kernels.consistency import DTYPE_CODES, OP_CODES, pack_signature
from ...kernels.launcher import Launcher
from ...units import round_up
from ..selection import read_table
from ..validation import DTYPE_NAMES
from .combine import COMBINE_STAGES, launch_combine, moe_combine_kernel
from .dispatch import launch_send, moe_send_kernel
from .gather import launch_gather, moe_gather_kernel
from .onekernel import DISPATCH_STAGES, launch_dispatch_one_kernel, moe_dispatch_one_kernel
from .route import ROUTED_STAGES, launch_route, moe_route_kernel
from .shape import (
    DIRECT_FROM_BYTES,
    MOE_SWITCHES,
    NARROW_SEND_UP_TO,
    NEVER,
    ONE_KERNEL_ENTRIES,
    PREFILL_FROM,
    PREFILL_ONE_KERNEL_ENTRIES,
    PREFILL_ONE_KERNEL_ENTRIES_WIDE,
    PUSH_SPLIT_ELEMS,
    SHAPES,
    SHARED_COPY_FROM,
    THROUGHPUT_FROM_ELEMS,
    THROUGHPUT_FROM_ELEMS_EP2,
    MoEShape,
    default_prefill_from,
    default_shape,
    default_throughput_from,
    register_cap,
)

MODES = ("auto", "latency", "throughput")
#: What ``dispatch_path`` answers; a path's code in the call's signature is its place here, from 1.
DISPATCH_PATHS = ("one-kernel", "routed", "routed-direct", "send-gather")

__all__ = ["DIRECT_FROM_BYTES", "MODES", "NARROW_SEND_UP_TO", "NEVER", "ONE_KERNEL_ENTRIES", "PREFILL_FROM",
           "PREFILL_ONE_KERNEL_ENTRIES", "PREFILL_ONE_KERNEL_ENTRIES_WIDE",
           "PUSH_SPLIT_ELEMS", "SHAPES", "SHARED_COPY_FROM", "THROUGHPUT_FROM_ELEMS", "THROUGHPUT_FROM_ELEMS_EP2",
           "MOE_SWITCHES",
           "MoEAllToAll", "MoEHandle", "MoEShape", "default_prefill_from", "default_shape", "default_throughput_from",
           "heap_bytes_bound",
           "register_cap"]


def _launch_options(comm: Communicator, shape: MoEShape) -> dict[str, bool | int]:
    """PDL where the shape asks for it and the GPU has it (sm_90+); and a register cap that keeps
    every program of the grid resident at once (``maxnreg``: the SM's registers over the threads of
    ``ceil(programs / SMs)`` programs). Without the cap, the prefill shape's 8-warp gather (FP8) and
    combine took more than 128 registers per thread, so one program per SM ran where two were meant
    to (``docs/moe.md``)."""
    if comm.backend != "cuda":
        return {}
    props = torch.cuda.get_device_properties(comm.device)
    opts: dict[str, bool | int] = {"launch_pdl": True} if shape.pdl and props.major >= 9 else {}
    cap = register_cap(shape, props.multi_processor_count, getattr(props, "regs_per_multiprocessor", 65536))
    if cap is not None:
        opts["maxnreg"] = cap
    return opts


@dataclass(frozen=True)
class MoEHandle:
    """What ``combine`` needs from its ``dispatch``: the token count, the call it came from, and the
    call's bound on every rank's token count (``tokens_bound``, else ``max_tokens``), which also
    picks the launch shape."""

    n_tokens: int
    call: int
    bound: int


def _device_facts(backend: str, device: torch.device | None, world: int) -> tuple[int, dict[str, int]]:
    """What the default launch shapes depend on: ``device``'s SM count and its table's MoE switch points
    at ``world`` ranks (``MOE_SWITCHES``; 1 and none in the CPU world)."""
    if backend != "cuda":
        return 1, {}
    switches = read_table(backend, torch.cuda.get_device_name(device)).switches_for("moe", world)
    return torch.cuda.get_device_properties(device).multi_processor_count, switches


def heap_bytes_bound(backend: str, device: torch.device, world: int, *, max_tokens: int, hidden: int,
                     num_experts: int, top_k: int, dtype: torch.dtype = torch.bfloat16, capacity: int | None = None,
                     fp8_dispatch: bool = False, prefill_from: int | None = None,
                     shape: MoEShape | None = None) -> int:
    """An upper bound of the heap bytes a ``MoEAllToAll`` of these arguments takes from its
    communicator (at ``world`` ranks on ``backend``/``device``): every buffer any of its paths may
    allocate and its three channels' slots, each rounded to the heap's alignment. For sizing a
    communicator that holds one instance; not for the launch path."""
    sms, switches = _device_facts(backend, device, world) if shape is None else (1, {})
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


class MoEAllToAll:
    """See the module docstring."""

    def __init__(self, comm: Communicator, *, max_tokens: int, hidden: int, num_experts: int, top_k: int,
                 dtype: torch.dtype = torch.bfloat16, capacity: int | None = None, fp8_dispatch: bool = False,
                 mode: str = "auto", throughput_from: int | None = None, prefill_from: int | None = None,
                 shape: MoEShape | None = None, decode_shape: MoEShape | None = None, decode_below: int | None = None,
                 name: str = "moe") -> None:
        w = comm.world
        for what, v in (("max_tokens", max_tokens), ("hidden", hidden), ("num_experts", num_experts),
                        ("top_k", top_k)):
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"MoEAllToAll: {what} must be a positive int, got {v!r}")
        if num_experts % w:
            raise InvalidInputError(f"MoEAllToAll: {num_experts} experts do not split evenly over {w} ranks")
        if top_k > num_experts:
            raise InvalidInputError(f"MoEAllToAll: top_k {top_k} exceeds {num_experts} experts")
        if mode not in MODES:
            raise InvalidInputError(f"MoEAllToAll: mode must be one of {MODES}, got {mode!r}")
        sms, switches = _device_facts(comm.backend, comm.device, w)
        if throughput_from is None:
            throughput_from = default_throughput_from(w, hidden, switches)
        if prefill_from is None:
            prefill_from = default_prefill_from(switches)
        if not isinstance(throughput_from, int) or throughput_from < 0:
            raise InvalidInputError(f"MoEAllToAll: throughput_from must be an int >= 0, got {throughput_from!r}")
        if not isinstance(prefill_from, int) or prefill_from < 1:
            raise InvalidInputError(f"MoEAllToAll: prefill_from must be an int >= 1, got {prefill_from!r}")
        decode_below = prefill_from if decode_below is None else decode_below
        if not isinstance(decode_below, int) or decode_below < 0:
            raise InvalidInputError(f"MoEAllToAll: decode_below must be an int >= 0, got {decode_below!r}")
        if dtype not in (torch.bfloat16, torch.float16):
            raise InvalidInputError(f"MoEAllToAll: dtype must be bf16 or fp16, got {dtype}")
        self.comm, self.world, self.rank = comm, w, comm.rank
        self.max_tokens, self.hidden, self.num_experts, self.top_k, self.dtype = (max_tokens, hidden, num_experts,
                                                                                  top_k, dtype)
        self.local_experts = num_experts // w
        self.capacity = capacity if capacity is not None else w * max_tokens
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise InvalidInputError(f"MoEAllToAll: capacity must be a positive int, got {capacity!r}")
        if fp8_dispatch and hidden % 128:
            raise InvalidInputError(f"MoEAllToAll: FP8 dispatch needs hidden a multiple of 128, got {hidden}")
        self.fp8 = bool(fp8_dispatch)
        if shape is not None and not isinstance(shape, MoEShape):
            raise InvalidInputError(f"MoEAllToAll: shape must be a MoEShape, got {shape!r}")
        sh = shape or default_shape(comm.backend, max_tokens, sms, prefill_from, hidden,
                                    1 if fp8_dispatch else dtype.itemsize, w, switches)
        if decode_shape is None and shape is None and max_tokens >= prefill_from:
            decode_shape = default_shape(comm.backend, prefill_from - 1, sms, prefill_from, world=w)
            decode_shape = decode_shape if decode_shape != sh else None  # the CPU world has one shape
        if decode_shape is not None and (not isinstance(decode_shape, MoEShape) or not decode_shape.one_kernel
                                         or decode_shape.programs > sh.programs
                                         or decode_shape.packets != sh.packets or not sh.one_kernel):
            raise InvalidInputError(f"MoEAllToAll: decode_shape must be a one-kernel MoEShape with packets as the "
                                    f"instance's ({sh.packets}) and at most its {sh.programs} programs, on a "
                                    f"one-kernel instance shape; got {decode_shape!r}")
        sh, decode_shape = (self._fitted(s, top_k) if s is not None else None for s in (sh, decode_shape))
        self.shape = sh
        dev, m, k = comm.device, max_tokens, top_k
        wire = torch.float8_e4m3fn if self.fp8 else dtype
        self.mode = mode
        #: combine's switch, in total tokens per call (the kernel's runtime argument)
        # (at world 1 the owners are the caller: the throughput mode would only add a pass)
        self._throughput_from = {"auto": throughput_from if w > 1 else w * m + 1, "latency": w * m + 1,
                                 "throughput": 0}[mode]
        # heap: two halves each (the send's epoch parity) of the receive buffer (peers' rows), its scales,
        # the tables of ids, weights and token counts; the expert buffer; the partials buffer
        peers = max(w - 1, 1)
        self._one = sh.one_kernel and m * k <= sh.one_kernel_entries  # every call in one kernel
        #: the launch shape of one-kernel calls with a bound below ``decode_below`` (``_decode_call``), if
        #: not the instance's
        self.decode_shape = decode_shape
        self._decode_below = decode_below
        #: the one-kernel dispatch's packet buffers (Lamport, at rest between calls): per half, the peers'
        #: rows (``_packet_rows`` per peer), their scales and weights; the copy table below too
        routed = not self._one and max_tokens * top_k > sh.route_above
        #: the routed calls' rows as packets too (``MoEShape.routed_packets``): the packet buffers then
        #: hold every row of a call, and the plain receive buffer is not needed
        self._routed_packets = sh.packets and sh.routed_packets and routed
        #: the paired layout's code only in instances whose sources can give every program two rows
        self._pairs = sh.paired_layout and max_tokens >= 2 * sh.programs
        #: bytes per token row on the wire
        self._row_bytes = hidden * (1 if self.fp8 else dtype.itemsize)
        #: some calls send their rows straight into the peers' expert slots (``direct_from_bytes``)
        self._direct = routed and not self._routed_packets and sh.direct_from_bytes <= max_tokens * self._row_bytes
        #: some calls interleave the routed send kernel's sends and layout (``interleave_from``)
        self._interleave = routed and not self._routed_packets and sh.interleave_from <= max_tokens
        self._packets = (sh.one_kernel and sh.packets) or self._routed_packets
        self._packet_rows = m if self._routed_packets else \
            min(m, sh.one_kernel_entries // k) if self._packets else 0
        pr = peers * self._packet_rows
        self._precv = comm.empty((2, pr, hidden), wire) if self._packets else None
        self._psc = comm.empty((2, pr, hidden // 128), torch.float32) if self._packets and self.fp8 else None
        self._pw = comm.empty((2, pr * k), torch.float32) if self._packets else None
        plain = not ((self._one or self._routed_packets) and self._packets)  # some calls take the plain buffer
        self._recv = comm.empty((2, peers * m, hidden), wire) if plain else None
        self._ids = comm.empty((2, w * m * k), torch.int32)
        self._wtab = comm.empty((2, w * m * k), torch.float32)
        self._ntab = comm.empty((2, w), torch.int32)
        # two halves too: per block of block_e entries of every source and per superblock, its count per
        # expert (route.py)
        self._block_x = max(pow2_at_least(num_experts), 4)  # the histograms' width (BLOCK_X)
        self._hist_blocks = -(-m * k // sh.block_e)
        supers = -(-self._hist_blocks // sh.super_blocks)
        #: the one-kernel dispatch (onekernel.py): per half, a copy of every source's routing per program;
        #: every call on small instances, calls with a small ``tokens_bound`` on the others
        self._block_n = min(pow2_at_least(m * k), sh.one_kernel_entries)
        self._hist = None if self._one else \
            comm.empty((2, w * (self._hist_blocks + supers), self._block_x), torch.int32)
        # a copy per program (the shared copy, when a call takes it, is program 0's rows)
        self._copy = comm.empty((2, sh.programs * w * self._block_n), torch.int32) if sh.one_kernel else None
        #: the one-kernel packet dispatch's call check: per half, an int64 header per (program, source), 0 at rest
        most = max(sh.programs, decode_shape.programs if decode_shape is not None else 0)
        self._hdrs = comm.empty((2, most * w), torch.int64) if sh.one_kernel and self._packets else None
        if self._hdrs is not None:
            self._hdrs.zero_()
        #: for calls with the shared copy: per half, the programs of the running launch done with the copies
        self._readers = torch.zeros(2, dtype=torch.int32, device=dev) if self._packets else None
        self._sc = comm.empty((2, peers * m, hidden // 128), torch.float32) if self.fp8 and plain else None
        (self._recv_off, self._recv_half), (self._ids_off, self._ids_half) = self._halves(self._recv), \
            self._halves(self._ids)
        (p_off, p_half), (ps_off, ps_half), (pw_off, pw_half) = (self._halves(t) for t in (self._precv, self._psc,
                                                                                           self._pw))
        self._packet_args = dict(recv_off=p_off, recv_half=p_half, sc_off=ps_off, sc_half=ps_half, pw_off=pw_off,
                                 pw_half=pw_half)
        for t in (self._precv, self._psc, self._pw, self._copy if self._packets else None):
            if t is not None:  # at rest before the channels below are created: see there
                lamport_fill(t)
        (self._wtab_off, self._wtab_half), (self._ntab_off, self._ntab_half) = self._halves(self._wtab), \
            self._halves(self._ntab)
        self._sc_off, self._sc_half = self._halves(self._sc)
        self._hist_off, self._hist_half = self._halves(self._hist)
        self._copy_off, self._copy_half = self._halves(self._copy)
        self._hdr_off, self._hdr_half = self._halves(self._hdrs)
        self._ybuf = comm.empty((self.local_experts, self.capacity, hidden), dtype)
        self._ybuf_off = comm.heap_offset(self._ybuf)
        self._part = comm.empty((w, m, hidden), dtype) if self._throughput_from <= w * m else None
        self._part_off = comm.heap_offset(self._part) if self._part is not None else 0
        # the latency mode's Lamport buffer: a row per peer and token of a call below the switch, at rest
        self._lamport_rows = min(m, self._throughput_from - 1) if w > 1 else 0
        self._lpart = comm.empty((w, self._lamport_rows, hidden), dtype) if self._lamport_rows > 0 else None
        self._lpart_off = comm.heap_offset(self._lpart) if self._lpart is not None else 0
        if self._lpart is not None:
            lamport_fill(self._lpart)
        # The Lamport buffers are at rest before any peer writes them: creating a channel synchronises
        # the device and ends with a check that every rank passes (channels/channel.py).
        programs = self.shape.programs
        self._send_ch = Channel(comm, f"{name}.send", programs=programs,  # interleaved: a half slot each too
                                barrier_slots=2 * programs if self._interleave else programs)
        #: some calls interleave the throughput combine (``combine_interleave_from``): a half slot each too
        self._comb_interleave = w > 1 and sh.combine_interleave_from <= max_tokens
        #: the throughput combine's chunks without its barrier (``combine_chunks``): a progress slot each too
        self._comb_chunks = sh.combine_chunks if w > 1 else 0
        self._comb_ch = Channel(comm, f"{name}.combine", programs=programs,
                                barrier_slots=2 * programs if self._comb_interleave or self._comb_chunks else programs)
        #: the route kernel ends with a barrier of its own (``MoEShape.route_barrier``; routed packets need it)
        self._route_barrier = sh.route_barrier or self._routed_packets
        self._route_ch = Channel(comm, f"{name}.route", programs=programs,
                                 barrier_slots=programs if self._route_barrier or self._direct else 0) \
            if routed else None
        self._run_send = Launcher(moe_send_kernel, (programs,))
        self._run_combine = Launcher(moe_combine_kernel, (programs,))
        #: options of every kernel's launch (set once here: nothing is decided on the launch path)
        self._launch_opts: dict[str, bool | int] = _launch_options(comm, sh)
        self._run_gather = Launcher(moe_gather_kernel, (programs,))
        self._run_route = Launcher(moe_route_kernel, (programs,))
        #: the route, send and gather kernels' common launch arguments, and the send's routing block
        #: when it holds the routing
        self._tables = dict(max_tokens=m, ids_off=self._ids_off, ids_half=self._ids_half, ntab_off=self._ntab_off,
                            ntab_half=self._ntab_half, hist_off=self._hist_off, hist_half=self._hist_half,
                            hist_blocks=self._hist_blocks, block_e=sh.block_e, block_x=self._block_x,
                            super_blocks=sh.super_blocks, num_warps=sh.num_warps, launch_opts=self._launch_opts)
        self._held_block_n = pow2_at_least(m * k)
        #: the one-kernel dispatch's buffers: the packet ones, or the plain receive buffer and a barrier
        self._one_args = dict(self._packet_args, peer_rows=self._packet_rows, packets=True) if self._packets else \
            dict(recv_off=self._recv_off, recv_half=self._recv_half, sc_off=self._sc_off, sc_half=self._sc_half,
                 pw_off=0, pw_half=0, peer_rows=m, packets=False)
        #: the send kernel's receive buffers: the packet ones (``routed_packets``) or the plain ones
        self._send_bufs = dict(self._packet_args, packets=True) if self._routed_packets else \
            dict(recv_off=self._recv_off, recv_half=self._recv_half, sc_off=self._sc_off, sc_half=self._sc_half,
                 pw_off=0, pw_half=0, packets=False)
        self._run_one = Launcher(moe_dispatch_one_kernel, (programs,))
        ds = self.decode_shape
        #: the decode-shaped launches (``decode_shape``): the one-kernel dispatch and the combine
        self._run_one_decode = Launcher(moe_dispatch_one_kernel, (ds.programs,)) if ds else None
        self._run_combine_decode = Launcher(moe_combine_kernel, (ds.programs,)) if ds else None
        self._decode_opts = _launch_options(comm, ds) if ds else {}
        i32 = dict(dtype=torch.int32, device=dev)
        self._owner = torch.empty(m, k, **i32)  # per own entry: the expert's rank, or -1
        self._row = torch.empty(m, k, **i32)  # per own entry: local expert * capacity + slot there
        self._slot_of = torch.empty(w * m * k, **i32)  # per entry of a local expert: its expert-buffer row or -1
        self._weights = torch.empty(m, k, dtype=torch.float32, device=dev)
        self._counts = torch.empty(self.local_experts, **i32)
        #: the expert buffer (dispatch's result) and its scales: in the heap where peers store into it
        xe = (self.local_experts, self.capacity, hidden)
        self._out = comm.empty(xe, wire) if self._direct else torch.empty(xe, dtype=wire, device=dev)
        xs = (*xe[:2], hidden // 128)
        self._scales = (comm.empty(xs, torch.float32) if self._direct else
                        torch.empty(xs, dtype=torch.float32, device=dev)) if self.fp8 else None
        self._direct_offs = (comm.heap_offset(self._out), comm.heap_offset(self._scales) if self.fp8 else 0) \
            if self._direct else None
        self._combined = torch.empty(m, hidden, dtype=dtype, device=dev)
        # ids out of range, entries dropped on own experts; then both as last copied into _bad_host
        self._bad = torch.zeros(4, dtype=torch.int64, device=dev)
        self._bad_host = HostMappedWords(2, comm.backend == "cuda")  # _bad[:2] as last copied by a dispatch
        self._closed = False
        self._bad_reported = 0
        self._call = 0
        self._open_handle = -1
        #: what each dispatch leaves its combine (``header.py``): every rank's tokens, the tables' half
        self._header = torch.zeros(2 * pow2_at_least(w), dtype=torch.int32, device=dev)
        #: stage stamps of the one-kernel dispatch, the combine and the routed dispatch (``trace_stages``), or None
        self._traces: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._trace_from = 0  # the count of dispatches when the stamps were turned on

    # -- what callers use ------------------------------------------------------------------------
    def expert_buffer(self) -> torch.Tensor:
        """``[local_experts, capacity, hidden]`` in the heap: experts that write their outputs here
        spare ``combine`` a copy. Write it on the calling stream between ``dispatch`` and ``combine``
        (only this rank's ``combine`` reads it)."""
        return self._ybuf

    def buffers(self) -> dict[str, torch.Tensor]:
        """The instance's buffers by name, for inspection (tests, tools): what ``dispatch`` and ``combine``
        return (``experts``, ``scales`` with FP8, ``combined``) and the Lamport buffers that rest between
        calls (``lamport_partials``: the latency combine's; with packets ``packet_rows``, ``packet_scales``,
        ``packet_weights``, ``copies``: the one-kernel dispatch's). Only the buffers this instance has."""
        named = {"experts": self._out, "scales": self._scales, "combined": self._combined,
                 "lamport_partials": self._lpart, "packet_rows": self._precv, "packet_scales": self._psc,
                 "packet_weights": self._pw, "copies": self._copy if self._packets else None}
        return {name: t for name, t in named.items() if t is not None}

    def _fitted(self, sh: MoEShape, top_k: int) -> MoEShape:
        """``sh`` with whole FP8 scale groups per step and a row's entries within two routing blocks
        (``route.row_slots``)."""
        if self.fp8:
            sh = replace(sh, block_h=max(sh.block_h, 128), send_block_h=sh.send_block_h and max(sh.send_block_h, 128),
                         one_block_h=sh.one_block_h and max(sh.one_block_h, 128))
        return replace(sh, block_e=max(sh.block_e, pow2_at_least(top_k)))

    def dispatch_path(self, tokens_bound: int | None = None) -> tuple[str, MoEShape]:
        """The kernels a dispatch given ``tokens_bound`` launches and their launch shape (the same on
        every rank for the same bound): ``"one-kernel"`` (``onekernel.py``), ``"routed"`` (the route
        and send kernels), ``"routed-direct"`` (the same, the rows sent into the peers' slots:
        ``MoEShape.direct_from_bytes``) or ``"send-gather"`` (the send and gather kernels)."""
        if self._one or (self._copy is not None and tokens_bound is not None
                         and tokens_bound * self.top_k <= self.shape.one_kernel_entries):
            bound = self.max_tokens if tokens_bound is None else tokens_bound
            return "one-kernel", self.decode_shape if self._decode_call(bound) else self.shape
        if self._route_ch is None:
            return "send-gather", self.shape
        bound = self.max_tokens if tokens_bound is None else tokens_bound
        direct = self._direct and bound * self._row_bytes >= self.shape.direct_from_bytes
        return ("routed-direct" if direct else "routed"), self.shape

    def _decode_call(self, bound: int) -> bool:
        """Whether a call of at most ``bound`` tokens per rank (the same on every rank) launches with
        ``decode_shape``: a one-kernel call below ``decode_below`` on an instance that has one."""
        return (self.decode_shape is not None and bound < self._decode_below
                and bound * self.top_k <= self.shape.one_kernel_entries)

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
        return self._bad_host.read()[1]

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 tokens_bound: int | None = None) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                                                           torch.Tensor, MoEHandle]:
        """See the module docstring. Collective. ``tokens_bound``: a bound on every rank's token
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
        decode = sh is not self.shape
        if path == "one-kernel":
            launch_dispatch_one_kernel(
                self._run_one_decode if decode else self._run_one, self.comm, self._send_ch, self._out,
                self._scales, x, topk_ids, topk_weights,
                self._weights, self._slot_of, self._owner, self._row, self._counts, self._bad,
                self._bad_host.device_addr, max_tokens=self.max_tokens, num_experts=self.num_experts,
                capacity=self.capacity, local=self.local_experts, ids_off=self._ids_off, ids_half=self._ids_half,
                wtab_off=self._wtab_off, wtab_half=self._wtab_half, copy_off=self._copy_off, copy_half=self._copy_half,
                readers=self._readers if bound * self.top_k >= sh.shared_copy_from else None, bound=bound,
                block_n=min(pow2_at_least(bound * self.top_k), self._block_n) if sh.bounded_copies else self._block_n,
                header=self._header, trace=self._trace(0, self._call),
                block_x=self._block_x, block_h=sh.one_block_h or sh.send_block_h or sh.block_h, num_warps=sh.num_warps,
                senders=sh.senders(self.world), lookahead=sh.lookahead,
                launch_opts=self._decode_opts if decode else self._launch_opts, sig=sig, hdr_off=self._hdr_off,
                hdr_half=self._hdr_half, **self._one_args)
        else:
            self._dispatch_two_kernels(x, topk_ids, topk_weights, path == "routed-direct",
                                       self._interleave and bound >= sh.interleave_from, sig)
        self._call += 1
        self._open_handle = self._call
        return (self._out, self._scales) if self.fp8 else self._out, self._counts, MoEHandle(n, self._call, bound)

    def _dispatch_two_kernels(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                              direct: bool, interleave: bool = False, sig: int | None = None) -> None:
        """The route and send kernels (``direct``: the rows into the peers' slots; ``interleave``:
        ``MoEShape.interleave_from``), or (instances of at most ``route_above`` entries) the send and
        gather kernels (``route.py``, ``dispatch.py``, ``gather.py``)."""
        sh = self.shape
        tables = self._tables
        routed = self._route_ch is not None  # the same on every rank: the launches pair across ranks
        trace = self._trace(2, self._call) if routed else None
        if routed:
            launch_route(self._run_route, self.comm, self._route_ch, self._send_ch, topk_ids, self._bad,
                         num_experts=self.num_experts, barrier=self._route_barrier or direct, trace=trace,
                         **tables)
        launch_send(self._run_send, self.comm, self._send_ch, x, topk_ids, topk_weights, self._weights, self._bad,
                    self._out, self._scales, self._slot_of, self._owner, self._row, self._counts,
                    self._bad_host.device_addr, num_experts=self.num_experts, capacity=self.capacity,
                    local=self.local_experts, wtab_off=self._wtab_off, wtab_half=self._wtab_half,
                    block_h=sh.send_block_h or sh.block_h, routed=routed, block_n=self._held_block_n,
                    header=self._header, trace=trace, direct=self._direct_offs if direct else None,
                    lookahead=routed and sh.routed_lookahead, pairs=self._pairs,
                    interleave=interleave, sig=sig, **self._send_bufs,
                    **tables)
        if not routed:
            launch_gather(self._run_gather, self.comm, self._send_ch, self._out, self._scales, self._slot_of,
                          self._counts, self._bad, self._bad_host.device_addr, capacity=self.capacity,
                          local=self.local_experts, top_k=self.top_k, recv_off=self._recv_off,
                          recv_half=self._recv_half, sc_off=self._sc_off, sc_half=self._sc_half, block_h=sh.block_h,
                          header=self._header, pairs=self._pairs, **tables)

    def combine(self, y: torch.Tensor, handle: MoEHandle) -> torch.Tensor:
        """See the module docstring. Collective. Returns ``[n_tokens, hidden]`` (reused by the next call)."""
        if not isinstance(handle, MoEHandle) or handle.call != self._open_handle:
            raise InvalidInputError("moe combine: the handle is not the latest dispatch's, or was combined already")
        shape = (self.local_experts, self.capacity, self.hidden)
        if tuple(y.shape) != shape or y.dtype != self.dtype or y.device != self.comm.device:
            raise InvalidInputError(f"moe combine: y must be {self.dtype} {list(shape)} on {self.comm.device}, got "
                                    f"{y.dtype} {list(y.shape)} on {y.device}")
        self.check()
        self._debug_check("moe_combine", handle.bound)
        self._open_handle = -1
        if y.data_ptr() != self._ybuf.data_ptr():
            self._ybuf.copy_(y)
        out = self._combined
        decode = self._decode_call(handle.bound)
        sh = self.decode_shape if decode else self.shape
        launch_combine(self._run_combine_decode if decode else self._run_combine, self.comm, self._comb_ch,
                       self._header, out, self._weights, self._owner,
                       self._row, self._slot_of, handle.n_tokens, max_tokens=self.max_tokens,
                       throughput_from=self._throughput_from, lamport_rows=self._lamport_rows,
                       local=self.local_experts, ybuf_off=self._ybuf_off, ids_off=self._ids_off,
                       ids_half=self._ids_half, wtab_off=self._wtab_off, wtab_half=self._wtab_half,
                       part_off=self._part_off, lpart_off=self._lpart_off, block_h=sh.block_h,
                       num_warps=sh.num_warps, launch_opts=self._decode_opts if decode else self._launch_opts,
                       trace=self._trace(1, handle.call - 1), pushers=sh.pushers(handle.bound, self.hidden),
                       throughput_block_h=sh.throughput_block_h,
                       interleave=self._comb_interleave and not decode and handle.bound >= sh.combine_interleave_from,
                       chunks=0 if decode else self._comb_chunks)
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
        for ch in (self._send_ch, self._comb_ch, self._route_ch):
            if ch is not None:
                ch.close()
        for t in (self._recv, self._ids, self._wtab, self._ntab, self._hist, self._copy, self._hdrs, self._ybuf,
                  self._sc, self._part, self._lpart, self._precv, self._psc, self._pw,
                  *((self._out, self._scales) if self._direct else ())):
            if t is not None:
                self.comm.free(t)
        self._bad_host.close()

    def _halves(self, t: torch.Tensor | None) -> tuple[int, int]:
        """Heap offset of a two-half buffer and the bytes of one half; ``(0, 0)`` for none."""
        if t is None:
            return 0, 0
        return self.comm.heap_offset(t), t[0].numel() * t.element_size()

    # -- checks before any rank waits --------------------------------------------------------------
    def _check(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> int:
        self.check()  # first: a closed instance's host counters are gone
        bad_ids = self._bad_host.read()[0] - self._bad_reported  # a cumulative count
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
