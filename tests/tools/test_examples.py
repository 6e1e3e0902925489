"""The user-level example collective runs and agrees with torch.distributed."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from ..helpers import world_sizes

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "custom_collective.py"


def _job(ctx):
    spec = importlib.util.spec_from_file_location("custom_collective", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.demo(ctx, 3001)


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_custom_broadcast_example(worlds, world):
    assert all(worlds(world).run(_job))


def test_example_is_about_forty_lines_of_triton():
    src = EXAMPLE.read_text()
    kernel = src[src.index("@triton.jit"):src.index("class Broadcast")]
    assert len([line for line in kernel.splitlines() if line.strip()]) <= 40


@pytest.mark.nccl  # the baselines run on the default group
def test_layer_benchmarks_run_and_check_correctness(worlds):
    """The fused-layer benchmark code runs end to end (small shapes in the CPU world) and its
    correctness checks pass; the numbers themselves only mean something on GPUs."""
    from tritoncomm.tools.layers import format_layers, layers_rank

    reports = worlds(2).run(layers_rank, ["norm", "gemm", "decoder"], timeout=900)[0]
    for part in ("norm", "gemm", "decoder"):
        rows = reports[part]["rows"]
        assert rows and all(r["correct"] for r in rows), format_layers(reports[part])
        assert all(r["tritoncomm_us"] > 0 and r["baseline_us"] > 0 for r in rows)


@pytest.mark.nccl  # the baselines run on the default group
def test_moe_benchmark_runs_and_checks_correctness(worlds):
    """bench --op moe end to end in the CPU world (tiny shape): ours checked, every baseline timed."""
    from tritoncomm.tools.moebench import format_moe, moe_rank

    rep = worlds(2).run(moe_rank, ["tiny"], [3], timeout=900)[0]
    assert len(rep["rows"]) == 6 and all(r["correct"] for r in rep["rows"]), format_moe(rep)
    both = [r for r in rep["rows"] if r["op"] == "both" and r["dispatch_dtype"] == "bf16"]
    assert all(r["tritoncomm_latency_us"] and r["tritoncomm_throughput_us"] for r in both), format_moe(rep)
    for r in rep["rows"]:
        assert all(r[key] is not None for key in ("tritoncomm_us", "nccl_a2a_us", "nccl_agrs_us", "tc_agrs_us")), r
        assert r["nccl_a2a_us"] > 0, r  # each phase timed on its own, never a difference
