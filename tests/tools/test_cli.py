"""The command line refuses a bad one in one line, before any rank starts (exit 2), and says in the CPU
world that its times are not speed."""

from __future__ import annotations

import pytest

from tritoncomm.tools import cli

BAD = [
    ("bench --op allreducee", "allreducee not one of"),
    ("bench --modes foo", "foo not one of graph, eager"),
    ("demo --world 1", "at least 2 ranks"),
    ("demo --world 0", "at least 2 ranks"),
    ("demo --sizes 12Q", "'12Q' is not a size"),
    ("bench --sizes 1K,0", "'0' is not a positive size"),
    ("demo --json /no/such/folder/out.json", "no folder /no/such/folder"),
    ("bench --plot /no/such/folder/p.png", "no folder"),
    ("layers --parts norm,foo", "foo not one of"),
    ("tune --op allreduce,alltoall", "alltoall not one of"),
    ("bench --op moe --tokens 8,x", "positive whole numbers"),
    ("bench --op moe --shapes deepseek", "deepseek not one of"),
]


@pytest.mark.parametrize("argv,says", BAD, ids=[b[0] for b in BAD])
def test_a_bad_command_line_is_one_line_before_any_rank(argv, says, capsys, monkeypatch):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks started")

    monkeypatch.setattr(cli, "LocalWorld", no_ranks)
    monkeypatch.setattr(cli, "launch", no_ranks)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv.split())
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and err[-1].startswith("python -m tritoncomm: error:"), err


def test_the_moe_shapes_accepted_are_the_benchmarks():
    from tritoncomm.tools.moebench import MOE_SHAPES

    assert set(cli.CHOICES[("bench", "shapes")]) == set(MOE_SHAPES) == set(cli.CHOICES[("tune", "shapes")])


def test_bench_in_the_cpu_world_says_its_times_are_not_speed(capsys, tmp_path):
    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():  # e.g. a GPU image's own Python: Triton 3.6 with NumPy 2.4 or later
        pytest.skip(numpy_problem())
    out = tmp_path / "r.json"
    assert cli.main(["bench", "--backend", "cpu", "--world", "2", "--op", "allgather", "--sizes", "1K",
                     "--modes", "eager", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count(cli.CPU_CAVEAT) == 2, text  # before the run and under its table
    import json

    assert json.loads(out.read_text())["reports"][0]["caveat"] == cli.CPU_CAVEAT


def test_bench_costs_times_the_all_reduce_and_the_fused_norm_with_the_check_on_and_off(tmp_path):
    """``bench --op costs`` runs (CPU world: the rows' shape, not speed): an all-reduce row per size and a
    fused-norm row and a MoE row per token count, each with the call check on and off, and the versions it
    ran on."""
    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():
        pytest.skip(numpy_problem())
    out = tmp_path / "r.json"
    assert cli.main(["bench", "--backend", "cpu", "--world", "2", "--op", "costs", "--sizes", "1K,2K", "--tokens",
                     "1", "--json", str(out)]) == 0
    import json

    rep = json.loads(out.read_text())["reports"][0]
    assert [r["bytes"] for r in rep["rows"]] == [1024, 2048]
    assert [r["tokens"] for r in rep["norm_rows"]] == [1]
    for r in rep["rows"]:
        assert r["bounded_graph_us"] > 0 and r["unchecked_graph_us"] > 0 and "check_cost_pct" in r, r
    for r in rep["norm_rows"]:
        assert r["checked_us"] > 0 and r["unchecked_us"] > 0 and r["variant"], r
    assert [r["tokens"] for r in rep["moe_rows"]] == [1, 4]
    for r in rep["moe_rows"]:
        assert r["checked_us"] > 0 and r["unchecked_us"] > 0 and r["path"] == "one-kernel", r
    assert rep["torch"] and rep["triton"]


def test_tune_moe_out_writes_the_switches_into_a_table(tmp_path):
    """``tune --op moe --out``: the file's ``table`` holds the MoE switches as the runtime reads them, and
    its ``moe`` list the measured rows."""
    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():
        pytest.skip(numpy_problem())
    import json

    from tritoncomm.collectives.selection import SelectionTable

    out = tmp_path / "t.json"
    assert cli.main(["tune", "--backend", "cpu", "--world", "2", "--op", "moe", "--shapes", "tiny", "--tokens", "1",
                     "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    (r,) = data["moe"]
    switches = SelectionTable.from_json(data["table"], "t").switches_for("moe", 2)
    assert switches["prefill_from_tokens"] == r["prefill_from"], (switches, r)
    assert set(switches) == {"prefill_from_tokens", "throughput_from_tokens"}, switches


def test_bench_deterministic_times_what_the_engines_deterministic_modes_run(tmp_path):
    """``bench --op deterministic`` (CPU world: the rows' shape and checks, not speed): per size the
    all-reduce and NCCL's (gloo here), per token count the fused norm and both unfused paths, each checked."""
    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():
        pytest.skip(numpy_problem())
    import json

    out = tmp_path / "d.json"
    assert cli.main(["bench", "--backend", "cpu", "--world", "2", "--op", "deterministic", "--sizes", "1K",
                     "--tokens", "1,3", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())["reports"][0]
    assert [r["bytes"] for r in rep["rows"]] == [1024] and [r["tokens"] for r in rep["norm_rows"]] == [1, 3]
    for r in rep["rows"] + rep["norm_rows"]:
        assert r["correct"], r
    for r in rep["norm_rows"]:
        assert r["fused_us"] > 0 and r["unfused_tritoncomm_us"] > 0 and r["unfused_nccl_us"] > 0, r
        assert r["engine_tritoncomm_us"] > 0 and r["engine_vllm_ca_us"] is None, r  # no peers in the CPU world
    assert rep["torch"] and rep["triton"]
