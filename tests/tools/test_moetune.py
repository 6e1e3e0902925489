"""``tune --op moe``: the switch rule, the report end to end in the CPU world, its options applied."""

from __future__ import annotations

import torch

from tritoncomm.collectives.moe import PREFILL_FROM, MoEAllToAll, default_prefill_from, default_throughput_from
from tritoncomm.collectives.selection import SelectionTable
from tritoncomm.tools.moetune import NEVER, moe_tune_rank, options, switch_point, table_switches

from ..helpers import make_comm


def test_switch_point_is_where_wins_hold_to_the_largest_count():
    counts = [1, 8, 128, 4096]
    assert switch_point(counts, [False, False, True, True]) == 128
    assert switch_point(counts, [True, False, True, True]) == 128  # an early win does not count
    assert switch_point(counts, [True, True, True, True]) == 1
    assert switch_point(counts, [True, True, True, False]) is None


def _apply(ctx, opts):
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=3, hidden=256, num_experts=16, top_k=4, **opts)
    dev = ctx.device
    x = torch.randn(3, 256).to(torch.bfloat16).to(dev)
    ids = torch.stack([torch.randperm(16)[:4] for _ in range(3)]).to(dev)
    _, counts, h = moe.dispatch(x, ids, torch.rand(3, 4, device=dev))
    moe.combine(moe.expert_buffer(), h)
    n = int(counts.sum())
    moe.close()
    comm.close()
    return n


def test_moe_tune_reports_both_switches_and_they_apply(worlds):
    """Tiny shape at world 2: every row measured, switches among the measured counts (in total
    tokens for the mode) or NEVER, and the options build a working instance."""
    rep = worlds(2).run(moe_tune_rank, ["tiny"], [1, 3], timeout=900)[0]
    (r,) = rep["moe"]
    assert (r["world"], r["shape"], r["hidden"], r["experts"], r["top_k"]) == (2, "tiny", 256, 16, 4)
    assert [row["tokens"] for row in r["rows"]] == [1, 3]
    for row in r["rows"]:
        assert row["decode_us"] > 0 and row["prefill_us"] > 0 and row["throughput_us"] > 0, row
        assert row["latency_us"] == min(row["decode_us"], row["prefill_us"]), row
    assert r["prefill_from"] in (1, 3, NEVER) and r["throughput_from"] in (2, 6, NEVER), r
    opts = options(rep, world=2, hidden=256, num_experts=16, top_k=4)
    assert opts == {"prefill_from": r["prefill_from"], "throughput_from": r["throughput_from"]}
    assert options(rep, world=4, hidden=256, num_experts=16, top_k=4) == {}  # not tuned: the defaults stand
    assert sum(worlds(2).run(_apply, opts)) == 24  # every entry routed: 2 ranks x 3 tokens x 4 experts
    assert PREFILL_FROM < NEVER and default_throughput_from(2, 256) < NEVER
    # what --out writes: the table's switches, as the runtime reads them, beside the table's others
    base = SelectionTable({}, "t", switches={("moe", 2): {"interleave_from_tokens": 2048, "prefill_from_tokens": 7}})
    table = SelectionTable.from_json(table_switches(rep, base).to_json(), "out")
    tf = r["throughput_from"] // 2 if r["throughput_from"] < NEVER else NEVER
    assert table.switches_for("moe", 2) == {"interleave_from_tokens": 2048, "prefill_from_tokens": r["prefill_from"],
                                            "throughput_from_tokens": tf}
    assert default_prefill_from(table.switches_for("moe", 2)) == r["prefill_from"]
    assert default_throughput_from(2, 256, table.switches_for("moe", 2)) == min(2 * tf, NEVER)
    assert default_prefill_from({}) == PREFILL_FROM
