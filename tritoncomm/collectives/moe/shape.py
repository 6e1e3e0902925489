"""The MoE collective's launch shape (``MoEShape``), the shapes an instance given none takes
(``default_shape``, by instance size, world, row width and GPU), and the measured defaults they are
built from, each with the measurement that set it (``docs/moe.md`` has the runs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ...errors import InvalidInputError

#: ``combine``'s default switch from the latency to the throughput mode, in elements of partials a
#: rank receives per call, ``total tokens * hidden * (world - 1) / world`` (``default_throughput_from``
#: turns it into total tokens over the ranks, the kernel's switch). The latency mode's packets cost
#: their polls and resets per element received; the throughput mode a barrier per call. At EP4 on
#: H100s (2026-11-27, dispatch + combine in graphs, ``docs/moe.md``) the throughput mode won from 2.6 M
#: elements (DeepSeek-V3 at 128 tokens per rank, 2.75 M: 65.1 against 68.5 µs) and lost at 1.6 M
#: (Qwen3-MoE at 128: 48.5 against 45.2); the switch lies between. Measured at EP2 and EP4 only:
#: ``tune --op moe`` finds it for a deployment.
THROUGHPUT_FROM_ELEMS = 9 << 18
#: The same at EP2, where the latency mode sums in the reverse order of its pushes and so evens out
#: the programs with an extra row (``combine.py``). On two H100s (2026-11-27, both phases in graphs,
#: each mode forced, ``docs/moe.md``) the latency mode won at 2.75 M elements and below (DeepSeek-V3 at
#: 384 tokens per rank: 69.2 against 73.1 µs; Qwen3-MoE at 640, 2.6 M: 68.8 against 69.6) and lost
#: from 2.88 M (Qwen3-MoE at 704: 74.0 against 73.2; DeepSeek-V3 at 448, 3.2 M: 79.0 against 78.3).
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
#: (``MoEShape.shared_copy_from``). At EP2 on two H100s (DeepSeek-V3 and Qwen3-MoE, dispatch +
#: combine in graphs, ``docs/moe.md``) the shared copy cost 0.2-0.3 µs at 8 and 64 entries (1 and 8
#: tokens) and saved 0.6-1.7 µs at 1024 (128 tokens, 264 programs: 1.1 MB of per-program copies).
SHARED_COPY_FROM = 256


#: The default role split (``MoEShape.send_programs``, ``push_programs``), measured at EP2 on two
#: H100s (2026-11-26, dispatch + combine in graphs, both shapes, ``docs/moe.md``). Half the one-kernel
#: dispatch's programs sending saved 0.5-1.5 µs from 1 to 64 tokens (132 programs). Half the
#: combine's programs pushing saved a further 0.5-0.8 µs where ``tokens * hidden`` was at most 65536
#: (up to 8 tokens of DeepSeek-V3, hidden 7168; 16 of Qwen3-MoE, 4096) and cost 0.4-0.8 µs at
#: twice that.
PUSH_SPLIT_ELEMS = 1 << 16

#: A switch no call reaches (a count no call carries: ``direct_from_bytes``, and the tune's
#: ``prefill_from`` and ``throughput_from``).
NEVER = 1 << 62

#: ``MoEShape.direct_from_bytes``'s default: rows of a call per rank, in bytes on the wire. On H100s
#: (2026-11-27, dispatch + combine in graphs, ``docs/moe.md``) the direct rows took DeepSeek-V3 in
#: bf16 at 4096 tokens per rank (58.7 MB) from 596.1 to 587.2 µs at EP2 and 1283.0 to 1251.7 at EP4,
#: and lost where the barrier they need costs more than the writes they save: Qwen3-MoE at 4096
#: (33.5 MB) 351.5 -> 359.1 and 772.6 -> 777.7, both shapes at 512 tokens (at most 7.3 MB), and the
#: DeepSeek-V3 FP8 dispatch at 4096 (29.4 MB) at EP2, 217.9 -> 231.7 µs (two runs of the bench).
#: The switch lies between.
DIRECT_FROM_BYTES = 3 << 24

#: ``MoEShape.one_kernel_entries``'s default: the most routing entries per rank that the one-kernel
#: dispatch takes.
ONE_KERNEL_ENTRIES = 1024

#: The prefill shape's ``one_kernel_entries`` at EP2 (256 tokens of top-8). At EP2 on two H100s (2026-11-26,
#: dispatch + combine in graphs, ``docs/moe.md``) the one-kernel dispatch took instances sized for 256 tokens
#: from 60.4 to 54.2 µs (DeepSeek-V3) and 44.2 to 34.3 (Qwen3-MoE) against the route and send
#: kernels; at 512 tokens (4096 entries) it lost (100.1 -> 113.8, 68.0 -> 74.0). On two H200s
#: (2026-11-28, in turn, 2 rounds) it kept 256 tokens (47.7 against 48.7 µs, 30.5 against 34.7).
PREFILL_ONE_KERNEL_ENTRIES = 2048

#: The prefill shape's ``one_kernel_entries`` at more than two ranks (128 tokens of top-8): each layout
#: program compares a row with every peer's routing copy, so the one-kernel dispatch's cost grows with
#: the world. At EP4 on four H200s (2026-11-28, dispatch + combine in graphs, in turn, 2 rounds,
#: ``docs/moe.md``) the route and send kernels took 256 tokens per rank from 119.0 to 98.2 µs
#: (DeepSeek-V3) and 79.9 to 69.6 (Qwen3-MoE); at 128 tokens the send and gather kernels lost (61.8
#: -> 62.8, 44.3 -> 49.2).
PREFILL_ONE_KERNEL_ENTRIES_WIDE = 1024


@dataclass(frozen=True)
class MoEShape:
    """Launch shape for one backend (``MoEAllToAll(shape=...)`` overrides the default)."""

    programs: int  #: send, gather and combine programs (one barrier slot each; on GPUs, per SM)
    block_h: int  #: columns per step
    block_e: int  #: routing entries per block of the send's histograms (``route.py``)
    num_warps: int
    send_block_h: int = 0  #: columns per step of the send kernel; 0: ``block_h``
    super_blocks: int = 16  #: routing blocks per superblock of the histogram table (``route.py``)
    #: Programmatic dependent launch (sm_90+; ignored elsewhere): about a microsecond less per
    #: kernel boundary (``docs/moe.md``).
    pdl: bool = True
    #: Dispatch in one kernel (``onekernel.py``) where ``max_tokens * top_k`` is at most
    #: ``one_kernel_entries``, and on larger instances for calls whose ``tokens_bound * top_k`` is;
    #: with False, never.
    one_kernel: bool = False
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
    #: default): ``programs / world`` send (with packets; else 0; ``senders``). At EP4 on four H200s
    #: (2026-11-28, both phases in graphs, in turn, 2 rounds, ``docs/moe.md``) a quarter sending
    #: instead of half took DeepSeek-V3 from 18.6 to 16.9 µs at 8 tokens per rank and 61.9 to 57.6 at
    #: 128 (264 programs), Qwen3-MoE from 16.3 to 14.6 and 44.4 to 41.5 (level at 1 token); at EP2 a
    #: quarter or a third lost 0.0-0.2 µs at 1 and 8 tokens.
    send_programs: int = -1
    #: In the latency combine, the first ``push_programs`` programs push the partials of the peers'
    #: tokens and the others sum this rank's tokens as the partials arrive; 0: every program pushes,
    #: then sums; -1 (the default): half the programs push in calls whose token bound times hidden is
    #: at most ``push_split_elems``, none in larger ones.
    push_programs: int = -1
    #: The largest ``tokens_bound * hidden`` (``max_tokens`` for calls without a bound) whose
    #: combine splits its programs when ``push_programs`` is -1.
    push_split_elems: int = PUSH_SPLIT_ELEMS
    #: With packets, on instances that route (``route_above``): the send kernel's rows and weights
    #: travel as Lamport packets too, and it lays out each peer's row as it arrives instead of after
    #: its barrier (which it then has none of; the route kernel's barrier orders the calls).
    routed_packets: bool = False
    #: On instances that route: the route kernel ends with a barrier of its own. Without it (the
    #: default) the send kernel's barrier covers the routing too (each peer's send program arrives
    #: after the peer's route kernel has ended), so the rows go out as soon as this rank's routing is
    #: stored. Routed packets always keep it (their send kernel has no barrier), and so do calls
    #: with direct rows (``direct_from_bytes``). At EP2 on two H100s (2026-11-27, dispatch +
    #: combine in graphs, ``docs/moe.md``) leaving it out took DeepSeek-V3 from
    #: 92.2 to 87.6 µs at 512 tokens per rank and 600.2 to 595.8 at 4096, Qwen3-MoE from 64.4 to 59.8
    #: and 355.0 to 351.1.
    route_barrier: bool = False
    #: On instances that route, without routed packets: calls whose rows come to at least
    #: ``direct_from_bytes`` per rank (token bound times hidden times the wire's element size, the
    #: bound being ``tokens_bound``, else ``max_tokens``) end the route kernel with its barrier, then
    #: send each row straight into its first kept slot on each peer that keeps one, so that the peer
    #: copies it into its other slots only: one HBM write of the row less per peer than through the
    #: receive buffer, for a barrier more. The expert buffer of an instance that can take it is in the
    #: heap. ``NEVER``: no call.
    direct_from_bytes: int = DIRECT_FROM_BYTES
    #: The one-kernel dispatch's routing copies sized by the call's bound (``tokens_bound * top_k``,
    #: rounded up to a power of two) instead of the instance's ``max_tokens * top_k``: fewer entries
    #: for every program to hold, poll and count over in calls far below ``max_tokens``. One build
    #: per width, compiled at the width's first call: warm every bound up before graph capture, as
    #: engines do for each captured batch size. At EP2 on two H100s (2026-11-26, 4096-token instances,
    #: dispatch + combine in graphs, ``docs/moe.md``) it took DeepSeek-V3 from 11.4 / 12.1 to 8.7 /
    #: 9.6 µs at 1 / 8 tokens; widened to one entry per thread of a program (128), 9.4 / 10.0.
    bounded_copies: bool = True
    #: The most routing entries per rank (``max_tokens * top_k``, or ``tokens_bound * top_k`` for a
    #: call) that the one-kernel dispatch takes: each of its programs holds a source's whole routing
    #: in registers and compares every row's entries against it (``route.copy_slots``).
    one_kernel_entries: int = ONE_KERNEL_ENTRIES
    #: Instances with more routing entries per rank (``max_tokens * top_k``) than this dispatch with
    #: ``moe_route_kernel`` and then the send kernel, which also lays out the peers' rows; others (not
    #: in one kernel) with the send and gather kernels, every send program holding the call's routing.
    route_above: int = 1024
    #: Columns per step of the throughput combine; 0: ``block_h``. At EP2 on two H100s
    #: (2026-11-27, dispatch + combine in graphs, ``docs/moe.md``) 4096 instead of 2048, the latency
    #: combine keeping 2048, took DeepSeek-V3 from 586.8 to 557.4 µs at 4096 tokens per rank and
    #: 300.6 to 284.1 at 2048, Qwen3-MoE from 353.3 to 340.5 at 4096; 8192 lost (645.3, 463.9).
    #: ``block_h`` at 4096 (both modes) gained a quarter of that and lost in the latency mode.
    throughput_block_h: int = 0
    #: The one-kernel dispatch's sends and packet layout load one column block ahead: an item's
    #: first block is loaded with its routing, and each next block (or first look at a received
    #: block) is issued before the stores of the block before it (``send_items``, ``place_packets``).
    #: At EP2 on two H100s (2026-11-27, dispatch + combine in graphs, in turn, ``docs/moe.md``) it took
    #: DeepSeek-V3 from 49.0 to 47.9 µs at 256 tokens per rank and 18.2 to 17.9 at 64, Qwen3-MoE from
    #: 32.9 to 31.3 at 256, and cost 0.3 µs at 128 (27.5 -> 27.8; Qwen3-MoE 0.1).
    lookahead: bool = True
    #: The routed send kernel's loads one column block ahead too (``send_items``' ``LOOKAHEAD``): an
    #: item's first block loaded with its routing, each next block before the stores of the one
    #: before it. At EP2 on two H100s (2026-11-28, both phases in graphs, in turn with it off, 2
    #: rounds, ``docs/moe.md``) it took Qwen3-MoE from 47.2 to 46.6 µs at 384 tokens per rank, 56.4 to
    #: 56.1 at 512 and 331.5 to 329.8 at 4096, DeepSeek-V3 from 69.0 to 68.4 at 384 and 551.3 to 550.1
    #: at 4096; every round agreed.
    routed_lookahead: bool = True
    #: The layout of the peers' rows (the routed send kernel's after its barrier, and the gather
    #: kernel's) takes a program's rows two at a time in calls where a source sends every program two
    #: rows or more (on instances of at least ``2 * programs`` tokens): both rows' ids, slots and column
    #: blocks are loaded in one round each (``gather.place_pair``). At EP2 on two H200s (2026-11-28,
    #: both phases in graphs, in turn with it off, 2 rounds, ``docs/moe.md``) it took DeepSeek-V3 from
    #: 495.1 to 489.2 µs at 4096 tokens per rank and Qwen3-MoE from 303.9 to 298.3 (87.2 to 86.7 at
    #: 1024); with pairs also where programs had one or two rows, DeepSeek-V3 lost 1.6 µs at 512.
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
#: with a smaller ``tokens_bound`` on them the other one (``MoEAllToAll``'s ``decode_below``). At EP2
#: on two H100s (2026-11-26, dispatch + combine in graphs, ``docs/moe.md``) instances sized for 48, 64 and 96
#: tokens were as fast or faster with it (DeepSeek-V3 16.5 vs 19.8, 17.7 vs 21.4 and 24.9 vs 37.1
#: µs; Qwen3-MoE 14.7 vs 14.7, 14.5 vs 14.9 and 17.1 vs 23.0), at 32 tokens not (Qwen3-MoE 13.7 vs
#: 11.7; DeepSeek-V3 14.4 vs 14.7); bounded calls on 4096-token instances likewise (the prefill
#: shape against the decode shape: DeepSeek-V3 16.6 vs 19.9 µs at 48 tokens; at 32 14.9 vs 14.7,
#: Qwen3-MoE 13.9 vs 11.7). At EP1 on one H200 (2026-11-23, DeepSeek-V3, eager, GPU time by kernel): at
#: 128 and 4096 tokens two 8-warp programs per SM beat one 4-warp program (send + combine + gather
#: 22.1 vs 26.0 µs and 414 vs 611 µs); at 8 tokens they lose (12.4 vs 10.3 µs). Its send takes 4096
#: columns per step (against 1024 at 4096 tokens: send 43 vs 70 µs), its latency combine and gather
#: 2048 (at EP2 on two H100s, both phases against 4096: 128 tokens 32.7 vs 36.0 µs, 512 102.4 vs
#: 104.5, DeepSeek-V3), its throughput combine 4096 (``MoEShape.throughput_block_h``), its
#: one-kernel dispatch 2048 too (both phases at 128 tokens 31.1 vs 32.2 µs against 1024,
#: DeepSeek-V3; 21.1 vs 21.7 Qwen3-MoE; 4096 slower). Both shapes route in blocks of 64 entries
#: with superblocks of 16, in the gather kernel (``docs/moe.md``).
PREFILL_FROM = 48


#: The prefill shape's send steps 2048 columns (4 KB) for 16-bit rows of at most this many elements
#: on the wire, 4096 for others. At EP2 on two H100s (2026-11-27, both phases in graphs, in turn
#: with 4096, 3 rounds, ``docs/moe.md``) 2048 took Qwen3-MoE (hidden 4096, bf16) from 48.0 to 46.8 µs
#: at 384 tokens per rank and from 57.3 to 56.4 at 512 (1.9 µs less at 1024, 1.4 at 2048, 0.6 at
#: 4096), and DeepSeek-V3 (7168) from 556.2 to 563.4 at 4096 (0.1-0.6 less at 384-2048); with FP8
#: dispatch (rows of 4 KB on the wire) Qwen3-MoE lost with 2048 at every count (311.6 -> 332.1 at 4096,
#: in two bench runs).
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
