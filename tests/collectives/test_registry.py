"""Algorithms as objects: every collective's names, debug codes, default shapes and tuning candidates
come from its registry, and every table row names a registered algorithm."""

from __future__ import annotations

import pytest

import tritoncomm as tc
from tritoncomm.collectives import (
    ALGORITHMS,
    FUSED_ALGORITHMS,
    AllGather,
    AllReduce,
    Choice,
    FusedAllReduceAddRMSNorm,
    ReduceScatter,
    SelectionTable,
    default_table,
    load_table,
)
from tritoncomm.collectives.base import Algorithm
from tritoncomm.tools.tune import COLLECTIVES, candidates

from ..helpers import make_comm

FAMILIES = [AllReduce, AllGather, ReduceScatter, FusedAllReduceAddRMSNorm]


@pytest.mark.parametrize("coll", FAMILIES, ids=lambda c: c.__name__)
def test_registry_names_match_classes_and_shapes_cover_both_worlds(coll):
    assert coll.ALGORITHMS, coll
    for name, cls in coll.ALGORITHMS.items():
        assert issubclass(cls, Algorithm) and cls.name == name
        for backend in ("cuda", "cpu"):
            c = cls.default_choice(backend)
            assert c.algo == name and c.programs >= 1


def test_allreduce_registry_is_the_public_list():
    assert list(ALGORITHMS) == ["ll", "ll_twoshot", "oneshot", "twoshot", "lamport", "lamport_twoshot"]
    assert list(FUSED_ALGORITHMS) == ["ll", "oneshot", "twoshot", "ll_twoshot", "lamport"]
    assert ALGORITHMS["ll"].limit == 1 << 20 and ALGORITHMS["ll_twoshot"].limit == 4 << 20


@pytest.mark.parametrize("op", list(COLLECTIVES))
@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_tuning_candidates_come_from_the_registry(op, backend):
    names = set(COLLECTIVES[op].ALGORITHMS)
    seen = set()
    for k in range(10, 28):
        for c in candidates(op, 1 << k, backend):
            assert c.algo in names
            seen.add(c.algo)
    assert seen, f"{op} has no tuning candidate on {backend}"


def test_shipped_and_default_tables_name_only_registered_algorithms():
    for table in (load_table("cuda", "NVIDIA H200"), load_table("cpu")):
        for op, coll in COLLECTIVES.items():
            table.check_algorithms(op, tuple(coll.ALGORITHMS))


def test_gpu_default_rules_route_each_size_to_an_algorithm_that_can_serve_it():
    """The rules of thumb (GPUs without a measured table for a world size): every row's size is within
    its algorithm's own limit, the Lamport one-shot serves small messages at every world size of two
    or more, and the last row is the barrier two-shot (no limit)."""
    table = default_table("cuda")
    for world in range(2, 9):
        rows = table.entries("allreduce", world, "bf16")
        assert rows[0][1].algo == "lamport" and rows[-1][1].algo == "twoshot", (world, rows[0], rows[-1])
        for nbytes, c in rows[:-1]:
            limit = getattr(ALGORITHMS[c.algo], "limit", None)
            assert limit is None or nbytes <= limit, (world, nbytes, c)
            assert c.programs <= 2048, (world, nbytes, c)


def test_a_table_naming_an_unknown_algorithm_is_refused():
    t = SelectionTable({("allreduce", 2, "bf16"): [(1 << 20, Choice("nosuch", 1, 1024, 4))]}, "bad")
    with pytest.raises(ValueError, match="nosuch"):
        t.check_algorithms("allreduce", tuple(ALGORITHMS))


def test_choice_rounds_survive_json_and_old_tables_read_without_them():
    c = Choice("twoshot", 8, 2048, 8, rounds=2)
    assert Choice.from_json(c.to_json()) == c
    assert "rounds" not in Choice("twoshot", 8, 2048, 8).to_json()  # old digests stay the same
    with pytest.raises(ValueError):
        Choice("twoshot", 8, 2048, 8, rounds=0)


def test_a_launch_shape_gives_every_thread_an_element():
    """A block smaller than the program's threads is copied across them, and a Lamport or LL look
    counts one copy: such shapes are refused, from code and from tables alike."""
    assert Choice("lamport", 4, 256, 8).num_warps == 8
    for block, warps in ((128, 8), (16, 1), (96, 1)):
        with pytest.raises(ValueError, match="32 x num_warps"):
            Choice("lamport", 4, block, warps)
    with pytest.raises(ValueError, match="32 x num_warps"):
        Choice.from_json({"algo": "ll", "programs": 2, "block": 64, "num_warps": 4})


def test_the_fused_norms_picks_are_table_rows():
    """The fused norm's variant picks live in the device tables (op ``fused_norm``), survive JSON, enter
    the digest, name only registered variants, and where a table has none the family's defaults serve."""
    from tritoncomm.collectives import read_table
    from tritoncomm.collectives.fused_norm import DEFAULT_PICKS

    assert read_table("cuda", "NVIDIA H200").picks_for("fused_norm", 2) == DEFAULT_PICKS[2]
    assert read_table("cuda", "NVIDIA H100 80GB HBM3").picks_for("fused_norm", 4) == DEFAULT_PICKS[4]
    assert read_table("cuda", "NVIDIA H200").picks_for("fused_norm", 8) is None  # the defaults' turn
    for table in (load_table("cuda", "NVIDIA H200"), load_table("cuda", "NVIDIA H100 80GB HBM3")):
        table.check_algorithms("fused_norm", tuple(FUSED_ALGORITHMS))
    picks = {("fused_norm", 2): [(1 << 20, "ll"), (1 << 62, "twoshot")]}
    t = SelectionTable({}, "t", picks)
    back = SelectionTable.from_json(t.to_json())
    assert back.picks == picks and back.digest() == t.digest() != SelectionTable({}, "t").digest()
    with pytest.raises(ValueError, match="nosuch"):
        SelectionTable({}, "bad", {("fused_norm", 2): [(1 << 62, "nosuch")]}).check_algorithms(
            "fused_norm", tuple(FUSED_ALGORITHMS))
    with pytest.raises(ValueError, match="picks"):
        SelectionTable({}, "bad", {("allreduce", 2): [(1 << 62, "ll")]})


def test_the_moe_switch_points_are_table_rows():
    """The MoE switch points live in the device tables (``switches``, op ``moe``, per world), survive
    JSON and enter the digest; a table without them gives none (the shape's defaults then serve)."""
    from tritoncomm.collectives import read_table
    from tritoncomm.collectives.moe import MOE_SWITCHES

    h200 = read_table("cuda", "NVIDIA H200")
    assert h200.switches_for("moe", 2) == {"interleave_from_tokens": 2048, "throughput_from_tokens": 448}
    assert h200.switches_for("moe", 4) == {"combine_interleave_from_tokens": 4096, "interleave_from_tokens": 2048}
    assert h200.switches_for("moe", 8) == {} == read_table("cuda", "NVIDIA H100 80GB HBM3").switches_for("moe", 2)
    assert {k for w in (2, 4) for k in h200.switches_for("moe", w)} <= set(MOE_SWITCHES)
    t = SelectionTable({}, "t", switches={("moe", 2): {"interleave_from_tokens": 64}})
    back = SelectionTable.from_json(t.to_json())
    assert back.switches == t.switches and back.digest() == t.digest() != SelectionTable({}, "t").digest()
    with pytest.raises(ValueError, match="switches"):
        SelectionTable({}, "bad", switches={("allreduce", 2): {"x": 1}})


def _inspected(ctx):
    comm = make_comm(ctx)
    ar = tc.AllReduce(comm, max_bytes=64 << 10, algos=("oneshot", "twoshot"))
    plans = {name: (ar.algorithm(name).capacity, ar.algorithm(name).grid) for name in ar.algorithms}
    try:
        ar.algorithm("lamport")
        missing = None
    except tc.InvalidInputError as e:
        missing = str(e)
    ar.close()
    comm.close()
    return plans, missing


def test_the_algorithms_set_up_can_be_inspected(worlds):
    """``algorithm(name)``: each algorithm's launch plan, for tests and tools; one not set up is a clear error."""
    for plans, missing in worlds(2).run(_inspected):
        assert set(plans) == {"oneshot", "twoshot"} and all(cap > 0 and grid > 0 for cap, grid in plans.values())
        assert missing is not None and "lamport" in missing and "oneshot" in missing, missing
