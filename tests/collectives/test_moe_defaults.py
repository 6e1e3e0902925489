"""The MoE defaults: the launch shape by instance size, the send and push role split, and the combine's
switch from the latency to the throughput mode, from the packaged tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tritoncomm.collectives.moe import NEVER, SHAPES
from tritoncomm.collectives.selection import read_table
from tritoncomm.errors import InvalidInputError


def test_default_launch_shape_follows_the_instance_size():
    from tritoncomm.collectives.moe import PREFILL_FROM, default_shape

    decode, prefill = default_shape("cuda", PREFILL_FROM - 1, 132), default_shape("cuda", PREFILL_FROM, 132)
    assert (decode.programs, decode.num_warps, decode.one_kernel) == (132, 4, True)
    assert (prefill.programs, prefill.num_warps, prefill.one_kernel) == (264, 8, True)
    assert default_shape("cpu", 10_000, 1) == SHAPES["cpu"]
    # the prefill send steps 2048 columns for rows of at most NARROW_SEND_UP_TO, 4096 for wider ones
    from tritoncomm.collectives.moe import NARROW_SEND_UP_TO

    assert prefill.send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO).send_block_h == 2048
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO + 128).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO, wire_bytes=1).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=1024, wire_bytes=4).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM - 1, 132, hidden=4096) == decode
    # past two ranks the one-kernel dispatch stops at half the routing entries (the routed path beyond)
    from tritoncomm.collectives.moe import PREFILL_ONE_KERNEL_ENTRIES, PREFILL_ONE_KERNEL_ENTRIES_WIDE

    assert PREFILL_ONE_KERNEL_ENTRIES_WIDE < PREFILL_ONE_KERNEL_ENTRIES == prefill.one_kernel_entries
    assert default_shape("cuda", PREFILL_FROM, 132, world=4).one_kernel_entries == PREFILL_ONE_KERNEL_ENTRIES_WIDE
    assert default_shape("cuda", PREFILL_FROM - 1, 132, world=4) == decode
    # the interleaved send kernel: where the device table's switches give it, for wide rows of 2-byte elements
    h200 = {w: read_table("cuda", "NVIDIA H200").switches_for("moe", w) for w in (2, 4, 8)}
    wide = NARROW_SEND_UP_TO + 128
    for world in (2, 4):
        named = default_shape("cuda", PREFILL_FROM, 132, hidden=wide, world=world, switches=h200[world])
        assert named.interleave_from == h200[world]["interleave_from_tokens"] == 2048, world
    assert prefill.interleave_from == NEVER  # no switches
    for kw in ({"hidden": NARROW_SEND_UP_TO, "world": 2}, {"hidden": wide, "wire_bytes": 1, "world": 2},
               {"hidden": wide, "world": 8}):
        assert default_shape("cuda", PREFILL_FROM, 132, switches=h200[kw["world"]], **kw).interleave_from == NEVER, kw
    # the interleaved combine: at EP4 on an H200, any row width and wire
    for kw in ({"hidden": NARROW_SEND_UP_TO}, {"hidden": wide}, {"hidden": wide, "wire_bytes": 1}):
        named = default_shape("cuda", PREFILL_FROM, 132, world=4, switches=h200[4], **kw)
        assert named.combine_interleave_from == 4096, kw
        for world in (2, 8):
            assert default_shape("cuda", PREFILL_FROM, 132, world=world, switches=h200[world],
                                 **kw).combine_interleave_from == NEVER, (world, kw)
    assert default_shape("cuda", PREFILL_FROM, 132, world=4).combine_interleave_from == NEVER  # no switches
    assert default_shape("cuda", PREFILL_FROM - 1, 132, world=4, switches=h200[4]).combine_interleave_from == NEVER
    # the combine's switch: the H200's tokens per rank at EP2; the element rule elsewhere
    from tritoncomm.collectives.moe import THROUGHPUT_FROM_ELEMS_EP2, default_throughput_from

    assert default_throughput_from(2, 7168, h200[2]) == 2 * 448
    assert default_throughput_from(2, 7168) == -(-THROUGHPUT_FROM_ELEMS_EP2 * 2 // 7168)
    assert default_throughput_from(4, 7168, h200[4]) == default_throughput_from(4, 7168)


def test_role_split_resolves_from_the_shape_and_the_call():
    """``send_programs`` at -1 (the default) resolves to the programs over the world (with packets
    only), ``push_programs`` to half the programs (while ``bound * hidden`` is at most
    ``push_split_elems``), explicit values stand, and values outside ``[-1, programs)`` are refused."""
    from tritoncomm.collectives.moe import PUSH_SPLIT_ELEMS, default_shape

    sh = default_shape("cuda", 8, 132)
    assert sh.senders() == sh.senders(2) == sh.senders(1) == 66 and replace(sh, packets=False).senders() == 0
    assert sh.senders(3) == 44 and sh.senders(4) == 33 and replace(sh, send_programs=10).senders(4) == 10
    assert replace(sh, programs=2).senders(4) == 1  # the CPU world's two programs keep one of each
    assert replace(sh, send_programs=0).senders() == 0 and replace(sh, send_programs=10).senders() == 10
    assert sh.pushers(8, PUSH_SPLIT_ELEMS // 8) == 66 and sh.pushers(8, PUSH_SPLIT_ELEMS // 8 + 1) == 0
    assert sh.pushers(16, 7168) == 0 and sh.pushers(8, 7168) == 66 and sh.pushers(16, 4096) == 66
    assert replace(sh, push_programs=5).pushers(10_000, 7168) == 5
    for bad in (dict(send_programs=-2), dict(send_programs=132), dict(push_programs=132), dict(push_programs=-2),
                dict(push_split_elems=-1), dict(packets=False, send_programs=3)):
        with pytest.raises(InvalidInputError):
            replace(sh, **bad)


def test_default_combine_switch_counts_elements_received():
    """The automatic combine switch (``default_throughput_from``): the fewest total tokens with
    ``THROUGHPUT_FROM_ELEMS`` (at world 2 ``THROUGHPUT_FROM_ELEMS_EP2``) elements of partials received
    per rank, ``tokens * hidden * (world - 1) / world``. The points they were set between: at EP4
    DeepSeek-V3 (hidden 7168) at 128 tokens per rank in the throughput mode and Qwen3-MoE (4096) at
    128 in the latency mode; at EP2 DeepSeek-V3 at 384 and Qwen3-MoE at 640 in the latency mode,
    DeepSeek-V3 at 448 and Qwen3-MoE at 704 in the throughput mode."""
    from tritoncomm.collectives.moe import THROUGHPUT_FROM_ELEMS, THROUGHPUT_FROM_ELEMS_EP2, default_throughput_from

    for world, hidden in ((2, 7168), (4, 7168), (2, 4096), (4, 4096), (3, 100), (8, 7168)):
        t = default_throughput_from(world, hidden)
        elems = THROUGHPUT_FROM_ELEMS_EP2 if world == 2 else THROUGHPUT_FROM_ELEMS
        assert t * hidden * (world - 1) >= elems * world > (t - 1) * hidden * (world - 1)
    assert default_throughput_from(4, 7168) <= 4 * 128 < default_throughput_from(4, 4096)
    assert 2 * 384 < default_throughput_from(2, 7168) <= 2 * 448
    assert 2 * 640 < default_throughput_from(2, 4096) <= 2 * 704
    h100 = read_table("cuda", "NVIDIA H100 80GB HBM3").switches_for("moe", 2)
    assert default_throughput_from(2, 4096, h100) == default_throughput_from(2, 4096)


def test_default_combine_switch_counts_tokens_at_ep2_on_h200s():
    """At EP2 on H200s the switch counts tokens per rank for every hidden size (the latency mode won
    at 384 tokens per rank for both shapes, the throughput mode from 448); elsewhere on H200s, and
    on other GPUs, the elements rule stands."""
    from tritoncomm.collectives.moe import default_throughput_from

    h200 = {w: read_table("cuda", "NVIDIA H200").switches_for("moe", w) for w in (2, 3, 4, 8)}
    for hidden in (7168, 4096, 100):
        t = default_throughput_from(2, hidden, h200[2])
        assert 2 * 384 < t <= 2 * 448
    assert default_throughput_from(2, 4096, h200[2]) < default_throughput_from(2, 4096)
    for world, hidden in ((4, 7168), (4, 4096), (8, 7168), (3, 100)):
        assert default_throughput_from(world, hidden, h200[world]) == default_throughput_from(world, hidden)
