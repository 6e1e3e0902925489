"""The MoE collective's launch shape (``MoEShape``), the shapes an instance given none takes
(``default_shape``, by instance size, world, row width and GPU), and the defaults they are built from.
The runs that set each default: ``docs/moe.md``, "Where the defaults come from"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, replace
from types import MappingProxyType

from ...errors import InvalidInputError
from ...units import NO_LIMIT

#: ``combine``'s default switch from the latency to the throughput mode, in elements of partials a
#: rank receives per call, ``total tokens * hidden * (world - 1) / world`` (``default_throughput_from``
#: turns it into total tokens over the ranks, the kernel's switch). The latency mode's packets cost
#: their polls and resets per element received; the throughput mode a barrier per call. Set between the
#: counts where each mode won (``docs/moe.md``, "Where the defaults come from"); measured at EP2 and EP4
#: only: ``tune --op moe`` finds it for a deployment.
THROUGHPUT_FROM_ELEMS = 9 << 18
#: The same at EP2, where the latency mode sums in the reverse order of its pushes and so evens out
#: the programs with an extra row (``combine.py``).
THROUGHPUT_FROM_ELEMS_EP2 = 11 << 18
#: The MoE switch points a device's selection table may hold (``SelectionTable.switches``, op ``moe``,
#: per world size; ``collectives/tables/<device>.json``; the runs that set them: ``docs/moe.md``):
#:
#: * ``throughput_from_tokens``: the combine's switch in tokens per rank, whatever the hidden size, in
#:   place of ``THROUGHPUT_FROM_ELEMS(_EP2)`` (the H200 table: 448 at EP2);
#: * ``interleave_from_tokens``: ``MoEShape.interleave_from``'s default for rows of more than
#:   ``NARROW_SEND_UP_TO`` elements of 2 bytes on the wire (the H200 table: 2048 at EP2 and EP4);
#: * ``combine_interleave_from_tokens``: ``MoEShape.combine_interleave_from``'s default, any row width
#:   (the H200 table: 4096 at EP4);
#: * ``prefill_from_tokens``: ``MoEAllToAll``'s ``prefill_from`` default (``default_prefill_from``).
#:
#: Where the table has none, ``NEVER`` (the interleaves), the element rule (the combine's switch) or
#: ``PREFILL_FROM``. ``tune --op moe --out`` writes ``throughput_from_tokens`` and ``prefill_from_tokens``.
MOE_SWITCHES = ("throughput_from_tokens", "interleave_from_tokens", "combine_interleave_from_tokens",
                "prefill_from_tokens")

#: Routing entries per rank from which the one-kernel dispatch shares one routing copy per rank
#: (``MoEShape.shared_copy_from``): a copy per program costs ``programs * entries * 4`` bytes per peer,
#: the shared one a count every program waits on.
SHARED_COPY_FROM = 256


#: The default role split (``MoEShape.send_programs``, ``push_programs``): the latency combine splits
#: its programs into pushers and summers in calls of at most this many ``tokens * hidden``.
PUSH_SPLIT_ELEMS = 1 << 16

#: A switch no call reaches (a count no call carries: ``direct_from_bytes``, and the tune's
#: ``prefill_from`` and ``throughput_from``).
NEVER = NO_LIMIT

#: ``MoEShape.direct_from_bytes``'s default: rows of a call per rank, in bytes on the wire, from which
#: the direct rows' saved HBM writes outweigh the barrier they need.
DIRECT_FROM_BYTES = 3 << 24

#: ``MoEShape.one_kernel_entries``'s default: the most routing entries per rank that the one-kernel
#: dispatch takes.
ONE_KERNEL_ENTRIES = 1024

#: The prefill shape's ``one_kernel_entries`` at EP2 (256 tokens of top-8).
PREFILL_ONE_KERNEL_ENTRIES = 2048

#: The prefill shape's ``one_kernel_entries`` at more than two ranks (128 tokens of top-8): each layout
#: program compares a row with every peer's routing copy, so the one-kernel dispatch's cost grows with
#: the world.
PREFILL_ONE_KERNEL_ENTRIES_WIDE = 1024


@dataclass(frozen=True)
class MoEShape:
    """Launch shape for one backend (``MoEAllToAll(shape=...)`` overrides the default)."""

    # -- the grid
    programs: int  #: send, gather and combine programs (one barrier slot each; on GPUs, per SM)
    block_h: int  #: columns per step
    block_e: int  #: routing entries per block of the send's histograms (``route.py``)
    num_warps: int
    _: KW_ONLY  # the fields below are keyword-only
    # -- every kernel
    #: Programmatic dependent launch (sm_90+; ignored elsewhere): about a microsecond less per
    #: kernel boundary (``docs/moe.md``).
    pdl: bool = True
    # -- the one-kernel dispatch
    #: Dispatch in one kernel (``onekernel.py``) where ``max_tokens * top_k`` is at most
    #: ``one_kernel_entries``, and on larger instances for calls whose ``tokens_bound * top_k`` is;
    #: with False, never.
    one_kernel: bool = False
    #: The most routing entries per rank (``max_tokens * top_k``, or ``tokens_bound * top_k`` for a
    #: call) that the one-kernel dispatch takes: each of its programs holds a source's whole routing
    #: in registers and compares every row's entries against it (``route.copy_slots``).
    one_kernel_entries: int = ONE_KERNEL_ENTRIES
    #: Columns per step of the one-kernel dispatch; 0: as the send's.
    one_block_h: int = 0
    #: The one-kernel dispatch without a barrier: its routing copies, rows and weights travel as
    #: Lamport packets into buffers of their own (``onekernel.py``); with False, plain stores and a
    #: barrier.
    packets: bool = True
    #: With packets, calls of at least this many routing entries per rank (``tokens_bound * top_k``,
    #: or ``max_tokens * top_k`` for calls without a bound) send one copy of a rank's routing per peer,
    #: from program 0, which every program reads and the last one done resets; smaller calls a copy
    #: per program, which each resets (no shared count to wait on). 0: always shared.
    shared_copy_from: int = SHARED_COPY_FROM
    #: With packets, the one-kernel dispatch's first ``send_programs`` programs send this rank's rows
    #: (and lay out its own) and the others lay out the peers' rows as they arrive, so that no
    #: program's layout waits behind its own sends; 0: every program sends, then lays out; -1 (the
    #: default): ``programs / world`` send (with packets; else 0; ``senders``).
    send_programs: int = -1
    #: The one-kernel dispatch's routing copies sized by the call's bound (``tokens_bound * top_k``,
    #: rounded up to a power of two) instead of the instance's ``max_tokens * top_k``: fewer entries
    #: for every program to hold, poll and count over in calls far below ``max_tokens``. One build
    #: per width, compiled at the width's first call: warm every bound up before graph capture, as
    #: engines do for each captured batch size.
    bounded_copies: bool = True
    #: The one-kernel dispatch's sends and packet layout load one column block ahead: an item's
    #: first block is loaded with its routing, and each next block (or first look at a received
    #: block) is issued before the stores of the block before it (``send_items``, ``place_packets``).
    lookahead: bool = True
    # -- the two-kernel dispatch (route and send, or send and gather)
    #: Instances with more routing entries per rank (``max_tokens * top_k``) than this dispatch with
    #: ``moe_route_kernel`` and then the send kernel, which also lays out the peers' rows; others (not
    #: in one kernel) with the send and gather kernels, every send program holding the call's routing.
    route_above: int = 1024
    send_block_h: int = 0  #: columns per step of the send kernel; 0: ``block_h``
    super_blocks: int = 16  #: routing blocks per superblock of the histogram table (``route.py``)
    #: With packets, on instances that route (``route_above``): the send kernel's rows and weights
    #: travel as Lamport packets too, and it lays out each peer's row as it arrives instead of after
    #: its barrier (which it then has none of; the route kernel's barrier orders the calls).
    routed_packets: bool = False
    #: On instances that route: the route kernel ends with a barrier of its own. Without it (the
    #: default) the send kernel's barrier covers the routing too (each peer's send program arrives
    #: after the peer's route kernel has ended), so the rows go out as soon as this rank's routing is
    #: stored. Routed packets always keep it (their send kernel has no barrier), and so do calls
    #: with direct rows (``direct_from_bytes``).
    route_barrier: bool = False
    #: On instances that route, without routed packets: calls whose rows come to at least
    #: ``direct_from_bytes`` per rank (token bound times hidden times the wire's element size, the
    #: bound being ``tokens_bound``, else ``max_tokens``) end the route kernel with its barrier, then
    #: send each row straight into its first kept slot on each peer that keeps one, so that the peer
    #: copies it into its other slots only: one HBM write of the row less per peer than through the
    #: receive buffer, for a barrier more. The expert buffer of an instance that can take it is in the
    #: heap. ``NEVER``: no call.
    direct_from_bytes: int = DIRECT_FROM_BYTES
    #: The routed send kernel's loads one column block ahead too (``send_items``' ``LOOKAHEAD``): an
    #: item's first block loaded with its routing, each next block before the stores of the one
    #: before it.
    routed_lookahead: bool = True
    #: The layout of the peers' rows (the routed send kernel's after its barrier, and the gather
    #: kernel's) takes a program's rows two at a time in calls where a source sends every program two
    #: rows or more (on instances of at least ``2 * programs`` tokens): both rows' ids, slots and column
    #: blocks are loaded in one round each (``gather.place_pair``).
    paired_layout: bool = True
    #: On instances that route, without routed packets: calls of at least this many tokens per rank
    #: (``tokens_bound``, else ``max_tokens``: the same on every rank) interleave the routed send
    #: kernel's work: each program sends the first half of its rows, publishes them at a barrier
    #: slot of its own, then lays out the first half of what each peer's counterpart sent it while
    #: it sends its second half, and the rest after its barrier, so that the layout's HBM work runs
    #: while rows still cross the links. Another build of the send kernel, compiled at the first such
    #: call: warm one up before graph capture. ``NEVER``: no call (``default_shape`` sets it for wide
    #: rows at two and four ranks on some GPUs: the table's ``interleave_from_tokens``, ``MOE_SWITCHES``).
    interleave_from: int = NEVER
    # -- the combine
    #: In the latency combine, the first ``push_programs`` programs push the partials of the peers'
    #: tokens and the others sum this rank's tokens as the partials arrive; 0: every program pushes,
    #: then sums; -1 (the default): half the programs push in calls whose token bound times hidden is
    #: at most ``push_split_elems``, none in larger ones.
    push_programs: int = -1
    #: The largest ``tokens_bound * hidden`` (``max_tokens`` for calls without a bound) whose
    #: combine splits its programs when ``push_programs`` is -1.
    push_split_elems: int = PUSH_SPLIT_ELEMS
    #: Columns per step of the throughput combine; 0: ``block_h``.
    throughput_block_h: int = 0
    #: Calls of at least this many tokens per rank (the dispatch's bound) interleave the throughput
    #: combine's work: each program pushes the first half of its partials, publishes them at a barrier
    #: slot of its own, then adds up the first half of its own tokens (whose peers' partials came in
    #: the peers' first halves) while it pushes its second half, and the rest after its barrier.
    #: Another build of the combine, compiled at the first such call: warm one up before graph
    #: capture. ``NEVER``: no call (``default_shape`` sets it at four ranks on some GPUs:
    #: the table's ``combine_interleave_from_tokens``).
    combine_interleave_from: int = NEVER
    #: Above 0: the throughput combine without its barrier, in this many chunks. Each program pushes
    #: its partials chunk by chunk and publishes after each how many chunks it has pushed (a barrier
    #: slot of its own, the count in the epoch); then it sums its own tokens of the chunk before,
    #: once every peer has published that chunk, computing its own part from its expert buffer (never
    #: storing and reading it back through ``out``, the plain mode's extra HBM pass) and adding the
    #: peers' partials in rank order: the same bits as the other modes. Not with
    #: ``combine_interleave_from`` (the same barrier slots), not in decode-shaped launches.
    combine_chunks: int = 0

    def __post_init__(self) -> None:
        for name in ("block_h", "block_e", "send_block_h", "one_block_h", "throughput_block_h", "super_blocks",
                     "route_above", "one_kernel_entries"):
            v = getattr(self, name)
            lowest = 0 if name in ("send_block_h", "one_block_h", "throughput_block_h") else 1  # 0: as block_h
            if v < lowest or v & (v - 1):
                raise InvalidInputError(f"MoEShape: {name} must be a power of two, got {v}")
        if self.direct_from_bytes < 0:
            raise InvalidInputError(f"MoEShape: direct_from_bytes must be at least 0, got {self.direct_from_bytes}")
        for name in ("interleave_from", "combine_interleave_from"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"MoEShape: {name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.combine_chunks <= 64 or (self.combine_chunks and self.combine_interleave_from != NEVER):
            raise InvalidInputError(f"MoEShape: combine_chunks must be in [0, 64] and 0 with combine_interleave_from, "
                                    f"got {self.combine_chunks} (combine_interleave_from "
                                    f"{self.combine_interleave_from})")
        if self.shared_copy_from < 0:
            raise InvalidInputError(f"MoEShape: shared_copy_from must be at least 0, got {self.shared_copy_from}")
        if self.programs < 1 or self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise InvalidInputError(f"MoEShape: bad programs or warps in {self}")
        if not -1 <= self.push_programs < self.programs or self.push_split_elems < 0:
            raise InvalidInputError(f"MoEShape: push_programs must be -1 or in [0, programs), got "
                                    f"{self.push_programs} of {self.programs} programs (push_split_elems "
                                    f"{self.push_split_elems})")
        if not -1 <= self.send_programs < self.programs or (self.send_programs > 0 and not self.packets):
            raise InvalidInputError(f"MoEShape: send_programs must be -1, 0, or with packets in [1, programs), got "
                                    f"{self.send_programs} of {self.programs} programs (packets={self.packets})")

    def senders(self, world: int = 2) -> int:
        """The one-kernel dispatch's sending programs at ``world`` ranks (``send_programs`` resolved):
        by default ``programs / world``, at least one (at least half of them lay out: the peers'
        ``world - 1`` shares of the rows against this rank's one)."""
        if self.send_programs >= 0:
            return self.send_programs
        return max(self.programs // max(world, 2), 1) if self.packets else 0

    def pushers(self, bound: int, hidden: int) -> int:
        """The latency combine's pushing programs in a call of at most ``bound`` tokens per rank
        (``push_programs`` resolved)."""
        if self.push_programs >= 0:
            return self.push_programs
        return self.programs // 2 if bound * hidden <= self.push_split_elems else 0


#: Launch shapes by kind of instance; on GPUs ``programs`` is set from the SM count at construction
#: (``default_shape``).
SHAPES = {"cuda": MoEShape(132, 1024, 64, 4, one_kernel=True),
          "cuda-prefill": MoEShape(264, 2048, 64, 8, send_block_h=4096, throughput_block_h=4096, one_kernel=True,
                                   one_block_h=2048,
                                   one_kernel_entries=PREFILL_ONE_KERNEL_ENTRIES),
          "cpu": MoEShape(2, 64, 16, 1, one_kernel=True)}

#: Instances sized for at least this many tokens per rank get the ``cuda-prefill`` shape, and calls
#: with a smaller ``tokens_bound`` on them the other one (``MoEAllToAll``'s ``decode_below``): two
#: 8-warp programs per SM, 4096 columns per send step and per throughput-combine step, 2048 per latency
#: combine, gather and one-kernel dispatch step. Both shapes route in blocks of 64 entries with
#: superblocks of 16.
PREFILL_FROM = 48


#: The prefill shape's send steps 2048 columns (4 KB) for 16-bit rows of at most this many elements
#: on the wire, 4096 for others.
NARROW_SEND_UP_TO = 4096


def default_shape(backend: str, max_tokens: int, sms: int, prefill_from: int = PREFILL_FROM,
                  hidden: int | None = None, wire_bytes: int = 2, world: int = 2,
                  switches: Mapping[str, int] = MappingProxyType({})) -> MoEShape:
    """The launch shape of an instance given none: in the CPU world ``SHAPES["cpu"]``; on GPUs one
    4-warp send/gather/combine program per SM and 1024 columns per step below ``prefill_from``
    tokens per rank, two 8-warp ones per SM (4096 columns per send step, 2048 per other step) from
    it on, the send stepping 2048 columns for rows of ``hidden`` up to ``NARROW_SEND_UP_TO`` elements of
    ``wire_bytes == 2`` bytes on the wire (``MoEAllToAll`` gives its ``hidden`` and the wire's element
    size: 1 with FP8 dispatch), the one-kernel dispatch up to ``PREFILL_ONE_KERNEL_ENTRIES_WIDE``
    routing entries at more than two ranks (``world``), and where the device's table gives them for this
    world (``switches``, ``MOE_SWITCHES``) the interleaved send kernel for wider rows of 2-byte elements
    and the interleaved combine from their counts of tokens. Every rank builds the same shape (the
    barriers pair program ``pid`` across ranks)."""
    if backend != "cuda":
        return SHAPES["cpu"]
    if max_tokens >= prefill_from:
        sh = replace(SHAPES["cuda-prefill"], programs=2 * sms)
        if world > 2:
            sh = replace(sh, one_kernel_entries=PREFILL_ONE_KERNEL_ENTRIES_WIDE)
        combine_from = switches.get("combine_interleave_from_tokens")
        if combine_from is not None:
            sh = replace(sh, combine_interleave_from=combine_from)
        narrow = hidden is not None and hidden <= NARROW_SEND_UP_TO and wire_bytes == 2
        if narrow:
            return replace(sh, send_block_h=2048)
        tokens = switches.get("interleave_from_tokens") if wire_bytes == 2 else None
        return sh if tokens is None or hidden is None else replace(sh, interleave_from=tokens)
    return replace(SHAPES["cuda"], programs=sms)


def register_cap(shape: MoEShape, sms: int, regs_per_sm: int = 65536) -> int | None:
    """Registers per thread that keep all of ``shape``'s programs resident on ``sms`` SMs at once
    (``maxnreg``, a multiple of 8, at least 32), or None where no cap is needed."""
    per_sm = -(-shape.programs // sms)
    cap = regs_per_sm // (per_sm * shape.num_warps * 32)
    return max(cap // 8 * 8, 32) if cap < 255 else None


def default_prefill_from(switches: Mapping[str, int] = MappingProxyType({})) -> int:
    """``MoEAllToAll``'s default ``prefill_from``: the device table's ``prefill_from_tokens`` for this
    world (``switches``), else ``PREFILL_FROM``."""
    return int(switches.get("prefill_from_tokens", PREFILL_FROM))


def default_throughput_from(world: int, hidden: int, switches: Mapping[str, int] = MappingProxyType({})) -> int:
    """``combine``'s default switch for ``world`` ranks and rows of ``hidden``, in total tokens over the
    ranks per call: the device table's ``throughput_from_tokens`` for this world (``switches``) per
    rank, else the fewest with ``THROUGHPUT_FROM_ELEMS`` (at world 2 ``THROUGHPUT_FROM_ELEMS_EP2``)
    elements of partials per rank."""
    if world < 2:
        return 1  # unused: at world 1 the automatic mode is the latency mode
    tokens = switches.get("throughput_from_tokens")
    if tokens is not None:
        return min(world * tokens, NEVER)  # NEVER stays NEVER (an int64 for the kernel)
    elems = THROUGHPUT_FROM_ELEMS_EP2 if world == 2 else THROUGHPUT_FROM_ELEMS
    return -(-elems * world // ((world - 1) * hidden))
