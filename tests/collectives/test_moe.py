"""MoE dispatch and combine against the reference (``moejob``): random routing with edge cases, token
counts that differ per rank and per call (zero included), "no expert" ids, full experts (capacity drops),
every dtype of ids, weights and tokens, both combine modes and calls switching between them, every
dispatch and combine variant a shape can ask for, outputs poisoned before each call; exact expert layouts
and counts, exact combine bits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tritoncomm.collectives.moe import NEVER, SHAPES, MoEShape
from tritoncomm.errors import InvalidInputError

from ..conftest import BACKEND
from ..helpers import dealt, world_sizes
from .moejob import job


@pytest.mark.parametrize("world,case,mode", [(w, "random", m) for w in world_sizes(2, 3, 4)
                                              for m in ("latency", "throughput")]
                         + dealt([(c, m) for c in ("one-rank", "hot", "unrouted") for m in ("latency", "throughput")],
                                 4, 3, 2))
def test_dispatch_combine_match_reference(worlds, world, case, mode):
    """Random routing in both modes at world 2, 3 and 4; the other cases (a token's experts all on
    one rank, an expert that every token routes to, experts that receive nothing) each once, over
    the three sizes."""
    experts = max(2 * world, 4) if case != "hot" else 4 * world
    for bad in worlds(world).run(job, experts, 3, 40, 6, case, 3, mode=mode):
        assert bad == []


@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_many_decode_calls_in_a_row(worlds, mode):
    """200 calls (4 in the CPU world) of 6 tokens of top-3 over 4 experts at world 2: on GPUs the
    one-kernel dispatch with packets and the call check, whose copies (2 x 32 entries) are fewer than
    a program's threads, so Triton holds each entry in two threads and a poll's count sees one of
    them. Every call's rows, counts and combine must match the reference."""
    reps = 200 if BACKEND == "cuda" else 4
    for bad in worlds(2).run(job, 4, 3, 40, 6, "random", reps, mode=mode):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("max_tokens", [1, 4])
def test_instances_of_a_few_tokens_called_full(worlds, world, max_tokens):
    """The instances ``tune --op moe`` measures (``max_tokens`` = the tokens of every call, hidden 256,
    16 experts, top-4), in the latency mode, called five times (each Lamport half used again) with
    every token on every rank."""
    for bad in worlds(world).run(job, 16, 4, 256, max_tokens, "random", 5, mode="latency", full=True):
        assert bad == []


@pytest.mark.parametrize("world,case,routing", dealt([("hot", "held"), ("unrouted", "routed"),
                                                        ("hot", "routed-packets"), ("unrouted", "routed-barrier"),
                                                        ("hot", "routed-direct"), ("unrouted", "held"),
                                                        ("hot", "routed-no-lookahead"), ("unrouted", "routed-single"),
                                                        ("hot", "held-single")], 3, 2))
def test_two_kernel_dispatch_matches_reference(worlds, world, case, routing):
    """The send + gather dispatch (``one_kernel=False``; the one-kernel dispatch is the CPU world's
    default) lays out, counts and combines exactly as the reference, capacity drops included: with
    every send program holding the call's routing, and (``routed``: instances of more than 4 entries)
    after the route kernel, with blocks of 4 entries in superblocks of 2 (``routed-packets``: its rows
    as packets, laid out as they arrive; ``routed-barrier``: the route kernel with a barrier of its own;
    ``routed-direct``: the rows sent into their first kept slot on each peer; ``routed-no-lookahead``: the
    send's loads not one column block ahead; ``-single``: the peers' rows laid out one at a time, not
    two, ``MoEShape.paired_layout``; with pairs a program of the two here lays out 3 rows of a source
    of 6, one pair and one row alone)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, paired_layout=not routing.endswith("-single"))
    if not routing.startswith("held"):
        shape = replace(shape, route_above=4, block_e=4, super_blocks=2, routed_packets=routing == "routed-packets",
                        route_barrier=routing == "routed-barrier",
                        direct_from_bytes=0 if routing == "routed-direct" else NEVER,
                        routed_lookahead=routing != "routed-no-lookahead")
    for bad in worlds(world).run(job, 4 * world, 3, 40, 6, case, 3, capacity=4 if case == "hot" else None,
                                 mode="throughput", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "direct", "fp8", "shares"], 2, 3, 4))
def test_interleaved_send_kernel_matches_reference(worlds, world, variant):
    """``MoEShape.interleave_from``: each routed send program sends the first half of its rows,
    then alternates one row of its second half with one of the first half each peer's counterpart
    sent it, and lays out the rest after its barrier (in pairs where a source gives every program
    two rows or more). Up to 30 tokens per rank over the 2 programs here (one rank with none in the
    first call), capacity drops (hot experts), every call exact: through the receive buffer, with
    the rows sent into their first kept slot (``direct``), with FP8 scales, and at one or two tokens
    per rank, where one row is split into two column shares (``shares``)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, interleave_from=1,
                    direct_from_bytes=0 if variant == "direct" else NEVER)
    hidden = 128 if variant in ("fp8", "shares") else 40
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(job, 4 * world, 3, hidden, max_tokens, "hot", 4, capacity=max_tokens * 2 // 3,
                                 fp8=variant == "fp8", mode="throughput", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "both", "shares", "fp8"], 2, 3, 4))
def test_interleaved_throughput_combine_matches_reference(worlds, world, variant):
    """``MoEShape.combine_interleave_from``: the throughput combine pushes the first half of each
    program's partials, adds up the first half of its own tokens while it pushes the second, and
    the rest after its barrier. Up to 30 tokens per rank over the 2 programs here (one rank with none
    in the first call), capacity drops, every call exact and the bits as without it (the reference
    sums in rank order); ``both``: with the interleaved send kernel too; ``shares``: at one or two
    tokens per rank, where a token's columns split into two shares (hidden 128); ``fp8``: after an
    FP8 dispatch (hidden 128)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2,
                    combine_interleave_from=1, interleave_from=1 if variant == "both" else NEVER)
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(job, 4 * world, 3, 40 if variant in ("plain", "both") else 128, max_tokens, "hot",
                                 4, capacity=max_tokens * 2 // 3, mode="throughput", shape=shape, fp8=variant == "fp8"):
        assert bad == []


@pytest.mark.parametrize("world,chunks,variant", dealt([(c, v) for c in (1, 3, 8) for v in ("plain", "shares", "fp8")],
                                                        2, 3, 4))
def test_chunked_throughput_combine_matches_reference(worlds, world, chunks, variant):
    """``MoEShape.combine_chunks`` 1, 3 and 8: no barrier; each program pushes its partials chunk by
    chunk, publishes each chunk and sums its own tokens of the chunk before, its own part computed
    from the expert buffer. Up to 30 tokens per rank over the 2 programs (one rank with none in the
    first call: chunks with nothing to push or sum), capacity drops, four calls in a row (each
    publishes higher counts than the last), every call exact and the bits as without it (the
    reference sums in rank order); ``shares``: one or two tokens per rank, a token's columns in two
    shares; ``fp8``: after an FP8 dispatch."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, combine_chunks=chunks)
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(job, 4 * world, 3, 40 if variant == "plain" else 128, max_tokens, "hot", 4,
                                 capacity=max_tokens * 2 // 3, mode="throughput", shape=shape, fp8=variant == "fp8"):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "interleaved", "chunked"], 2, 3))
def test_throughput_items_wider_than_a_step(worlds, world, variant):
    """Throughput items of twice ``THROUGHPUT_STEP`` columns (as on H200s), summed one step at a
    time in each throughput combine (``plain``, ``interleaved``, ``chunked``): hidden two items
    and 40 columns, so that an item's second step and the last item are partial."""
    from tritoncomm.collectives.moe.partials import THROUGHPUT_STEP

    extra = {"interleaved": {"combine_interleave_from": 1}, "chunked": {"combine_chunks": 3}}.get(variant, {})
    shape = replace(SHAPES["cpu"], one_kernel=False, throughput_block_h=2 * THROUGHPUT_STEP, **extra)
    for bad in worlds(world).run(job, 2 * world, 2, 4 * THROUGHPUT_STEP + 40, 3, "random", 2, mode="throughput",
                                 shape=shape):
        assert bad == []


def test_chunked_combine_excludes_the_interleaved_one():
    """Both use the combine's second barrier slots, with different counts: a shape asking for both is refused."""
    with pytest.raises(InvalidInputError, match="combine_chunks"):
        replace(SHAPES["cpu"], combine_chunks=2, combine_interleave_from=1)


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_interleaved_and_plain_calls_alternate_on_one_instance(worlds, world):
    """The interleaved send kernel and combine are chosen per call by its bound (``interleave_from``,
    ``combine_interleave_from``: 20 tokens on an instance of 30): calls without ``tokens_bound`` take
    them, every other call, given ``tokens_bound=10``, does not, so the half slots skip a call's
    epoch between uses. Six calls of at most 10 tokens per rank, every one exact."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, interleave_from=20,
                    combine_interleave_from=20)
    for bad in worlds(world).run(job, 4 * world, 3, 40, 30, "hot", 6, capacity=20, mode="throughput", shape=shape,
                                 call_tokens=10, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,super_blocks", [(2, 1), (3, 32)])
def test_slots_past_one_load_of_histogram_rows(worlds, world, super_blocks):
    """``route.row_slots`` loads the first ``BLOCK_B`` (here 16) superblock rows and the block rows in
    one round and sums any further rows after: with one entry per block, superblocks of one block
    (a row of 40 tokens has up to 39 superblocks before it) and of 32 blocks (up to 31 block rows
    before it) both take the rows past the first load, on the routed dispatch and its layout."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=1, super_blocks=super_blocks)
    for bad in worlds(world).run(job, 2 * world, 1, 8, 40, "random", 2, capacity=24, mode="latency",
                                 shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_direct_rows_with_fp8_scales(worlds, world):
    """Rows sent into their first kept slot on each peer (``MoEShape.direct_from_bytes``) with FP8
    dispatch: the values and their scales arrive in that slot and are copied into the row's other slots, with
    capacity drops (hot experts), every call exact."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, direct_from_bytes=0)
    for bad in worlds(world).run(job, 4 * world, 3, 128, 6, "hot", 3, capacity=4, fp8=True, mode="throughput",
                                 shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_shared_and_per_program_copies_alternate(worlds, world):
    """A one-kernel instance of 4 tokens of top-3 whose shape shares the routing copy from 12
    entries: calls without a bound (12 entries) share one copy, calls given ``tokens_bound=3`` (9)
    send a copy per program, alternating on the same copy table; every call exact and every Lamport
    buffer at rest after them."""
    shape = replace(SHAPES["cpu"], shared_copy_from=12)
    for bad in worlds(world).run(job, 4 * world, 3, 24, 4, "random", 4, shape=shape, call_tokens=3,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,throughput_block_h", dealt([0, 8, 32], 3, 2))
def test_auto_mode_switches_per_call_on_total_tokens(worlds, world, throughput_block_h):
    """Token counts drawn per rank and call (4 at most), the switch just below every rank's maximum:
    calls of both modes interleave on the same buffers, every one exact, with the throughput mode
    stepping as many columns as the latency mode (16), fewer, or more than a row (hidden 24)."""
    shape = replace(SHAPES["cpu"], block_h=16, throughput_block_h=throughput_block_h)
    for bad in worlds(world).run(job, 2 * world, 2, 24, 4, "unrouted", 6, throughput_from=4 * world - 1,
                                 both_modes=True, shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_full_experts_drop_later_entries_and_count_them(worlds, world):
    """Capacity 2 with one expert in every token's top-k: entries past slot 1 are dropped, in order."""
    for bad in worlds(world).run(job, 4 * world, 3, 24, 5, "hot", 3, capacity=2, mode="throughput"):
        assert bad == []


@pytest.mark.parametrize("dtype,ids_dtype,w_dtype", [(torch.float16, torch.int32, torch.float32),
                                                     (torch.bfloat16, torch.int32, torch.bfloat16)])
def test_every_dtype(worlds, dtype, ids_dtype, w_dtype):
    for bad in worlds(2).run(job, 6, 2, 33, 4, "random", 3, dtype, None, ids_dtype, w_dtype):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_fp8_dispatch_scales_per_128_values(worlds, world):
    for bad in worlds(world).run(job, 2 * world, 2, 256, 4, "random", 3, torch.bfloat16, None, torch.int64,
                                 torch.float32, True, "throughput"):
        assert bad == []


@pytest.mark.parametrize("world,mode,fp8,wide", dealt([("latency", False, False), ("throughput", False, False),
                                                       ("throughput", True, False), ("throughput", False, True)],
                                                      3, 2))
def test_rows_split_over_programs_by_column_blocks(worlds, world, mode, fp8, wide):
    """More programs than rows: rows' column blocks spread over programs (send, gather, both combine
    modes), for every token count from 0 to 6; the last block partial; the send's block twice the
    others'; routing in blocks of 4 entries (3 per row: rows straddle blocks), superblocks of 2;
    ``wide``: the throughput combine's blocks twice the others' too."""
    shape = MoEShape(programs=6, block_h=128 if fp8 else 16, block_e=4, num_warps=1, super_blocks=2,
                     send_block_h=256 if fp8 else 32, throughput_block_h=32 if wide else 0)
    hidden = 384 if fp8 else 40
    for bad in worlds(world).run(job, 4 * world, 3, hidden, 6, "unrouted", 4, torch.bfloat16, None, torch.int64,
                                 torch.float32, fp8, mode, shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,senders,fp8,shared_from,lookahead", dealt([(2, False, 1 << 20, True),
                                                                            (5, False, 0, True),
                                                                            (3, True, 0, False),
                                                                            (3, True, 1 << 20, True)], 3, 2))
def test_one_kernel_with_sending_and_layout_programs_apart(worlds, world, senders, fp8, shared_from, lookahead):
    """The one-kernel dispatch with its first ``senders`` of 6 programs sending and the others laying
    out (``MoEShape.send_programs``), and the latency combine with its first ``6 - senders`` pushing
    and the others summing (``push_programs``): rows split over either group by column blocks (three
    per row: loads one block ahead, ``MoEShape.lookahead``, or not), token counts drawn from 0 to 6,
    with a routing copy per program or one shared copy."""
    shape = MoEShape(programs=6, block_h=128 if fp8 else 16, block_e=4, num_warps=1, one_kernel=True,
                     send_programs=senders, shared_copy_from=shared_from, push_programs=6 - senders,
                     lookahead=lookahead)
    hidden = 384 if fp8 else 40
    for bad in worlds(world).run(job, 4 * world, 3, hidden, 6, "unrouted", 4, torch.bfloat16, None, torch.int64,
                                 torch.float32, fp8, "latency", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(8))
@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_world8(worlds, world, mode):
    for bad in worlds(world).run(job, 2 * world, 4, 16, 3, "random", 2, mode=mode, timeout=1500):
        assert bad == []
