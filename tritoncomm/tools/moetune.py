"""``tune --op moe``: measure MoE dispatch + combine per launch shape and combine mode, and choose.

For each MoE shape and token count per rank (random top-k routing, a fresh draw on every rank), the
two launch shapes of ``default_shape`` (``decode``: below ``prefill_from``; ``prefill``: from it on)
each run dispatch + combine with the latency combine, in CUDA graphs (the slowest rank's median).
The faster shape then runs with the throughput combine (world > 1). Every rank measures the same
candidates in the same order; rank 0 decides.

Per (world, shape) the result holds the measured rows and two switches, in the units of
``MoEAllToAll``'s options of the same names, so that ``MoEAllToAll(..., **options(result, ...))``
applies them:

* ``prefill_from``: the smallest measured token count from which the prefill shape wins at it and at
  every larger measured count (``NEVER`` if it never does);
* ``throughput_from``: ``world`` times the smallest measured token count from which the throughput
  combine wins at it and at every larger measured count (``NEVER`` if it never does; at world 1 the
  throughput mode is not measured).

Past the largest measured count the last choice is extrapolated: tune at the sizes the engine runs.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import torch

from ..channels import Communicator
from ..collectives import MoEAllToAll
from ..collectives.moe import NEVER, default_shape
from ..collectives.selection import SelectionTable, read_table
from ..config import CommConfig
from ..launch import RankContext
from .moebench import DEFAULTS, MOE_SHAPES, bench_capacity, measure_us
from .report import device_name, max_over_ranks

__all__ = ["NEVER", "moe_tune_rank", "options", "switch_point", "table_switches"]

#: backend: tokens per rank the tune times by default: each count times both launch shapes and both
#: combine modes, so fewer than the bench's.
TUNE_TOKENS = {"cuda": (1, 8, 128, 512, 4096), "cpu": (1, 8, 32)}


def switch_point(counts: list[int], wins: list[bool]) -> int | None:
    """The smallest of ``counts`` (ascending) from which ``wins`` holds at it and every larger one;
    None when it does not hold at the largest."""
    point = None
    for t, w in zip(reversed(counts), reversed(wins), strict=True):
        if not w:
            break
        point = t
    return point


def _time(ctx: RankContext, moe: MoEAllToAll, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> float:
    def step() -> None:
        _, _, h = moe.dispatch(x, ids, w)
        moe.combine(moe.expert_buffer(), h)

    return measure_us(ctx, step, "graph" if ctx.backend == "cuda" else "eager")


def _tune_shape(ctx: RankContext, comm: Communicator, shape: str, tokens: list[int]) -> dict[str, Any]:
    hidden, experts, k = MOE_SHAPES[shape]
    cuda = ctx.backend == "cuda"
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if cuda else 1
    rows: list[dict[str, Any]] = []
    for t in tokens:
        gen = torch.Generator(device=ctx.device).manual_seed(7919 * t + ctx.rank)
        x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
        w = torch.rand(t, k, device=ctx.device, generator=gen)
        common = dict(max_tokens=t, hidden=hidden, num_experts=experts, top_k=k,
                      capacity=bench_capacity(ctx.world, t, experts, k))
        # the device table's switches, as an instance given no shape takes them
        switches = read_table(ctx.backend, device_name(ctx)).switches_for("moe", ctx.world)
        launch = {"decode": default_shape(ctx.backend, 1, sms, world=ctx.world, switches=switches),
                  "prefill": default_shape(ctx.backend, NEVER, sms, hidden=hidden, world=ctx.world, switches=switches)}
        if not cuda:  # one CPU-world shape: twice its programs stands in for the prefill one
            launch["prefill"] = replace(launch["decode"], programs=2 * launch["decode"].programs)
        times: dict[str, float | None] = {}
        for label, sh in launch.items():
            moe = MoEAllToAll(comm, **common, mode="latency", shape=sh)
            times[label] = _time(ctx, moe, x, ids, w)
            moe.close()
        m = max_over_ranks(ctx, times)
        best = min(launch, key=lambda name: m[name])
        latency_us, throughput_us = m[best], None
        if ctx.world > 1:
            moe = MoEAllToAll(comm, **common, mode="throughput", shape=launch[best])
            throughput_us = max_over_ranks(ctx, {"t": _time(ctx, moe, x, ids, w)})["t"]
            moe.close()
        rows.append({"tokens": t, "decode_us": m["decode"], "prefill_us": m["prefill"], "shape": best,
                     "latency_us": latency_us, "throughput_us": throughput_us})
    counts = [r["tokens"] for r in rows]
    prefill = switch_point(counts, [r["prefill_us"] < r["decode_us"] for r in rows])
    thru = switch_point(counts, [r["throughput_us"] is not None and r["throughput_us"] < r["latency_us"]
                                 for r in rows])
    return {"world": ctx.world, "shape": shape, "hidden": hidden, "experts": experts, "top_k": k,
            "device": device_name(ctx), "date": datetime.date.today().isoformat(), "rows": rows,
            "prefill_from": NEVER if prefill is None else prefill,
            "throughput_from": NEVER if thru is None else ctx.world * thru}


def moe_tune_rank(ctx: RankContext, shapes: list[str] | None = None,
                  tokens: list[int] | None = None) -> dict[str, Any] | None:
    """Collective: tune every shape (default: the bench's) at every token count (default:
    ``TUNE_TOKENS``); the report on rank 0."""
    d_shapes, _ = DEFAULTS[ctx.backend]
    d_tokens = TUNE_TOKENS[ctx.backend]
    cuda = ctx.backend == "cuda"
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=(6 << 30) if cuda else 64 << 20))
    results = [_tune_shape(ctx, comm, s, sorted(tokens or d_tokens)) for s in shapes or d_shapes]
    comm.close()
    if ctx.rank:
        return None
    return {"device": device_name(ctx), "date": datetime.date.today().isoformat(),
            "timing": "CUDA graphs (32 calls per graph), median of 20 replays, slowest rank" if cuda
            else "CPU world: wall clock of interpreted kernels (not speed)", "moe": results}


def options(report: dict[str, Any], *, world: int, hidden: int, num_experts: int, top_k: int) -> dict[str, int]:
    """``MoEAllToAll`` keyword options from a ``tune --op moe`` report (its ``moe`` list) for this
    problem: ``prefill_from`` and ``throughput_from``; the defaults (``PREFILL_FROM`` and
    ``default_throughput_from``) stand when the report has no entry for it."""
    for r in report.get("moe", []):
        if (r["world"], r["hidden"], r["experts"], r["top_k"]) == (world, hidden, num_experts, top_k):
            return {"prefill_from": r["prefill_from"], "throughput_from": r["throughput_from"]}
    return {}



def table_switches(report: dict[str, Any], table: SelectionTable) -> SelectionTable:
    """``table`` with the MoE switches of a ``tune --op moe`` report, as the runtime reads them
    (``MOE_SWITCHES``, per world): for each world, the first tuned shape's ``throughput_from_tokens``
    (tokens per rank; ``throughput_from`` is in total tokens) and ``prefill_from_tokens``, beside the
    table's other switches of that world."""
    switches = dict(table.switches)
    done: set[int] = set()
    for r in report.get("moe", []):
        w = r["world"]
        if w in done:
            continue
        done.add(w)
        tuned = {"prefill_from_tokens": r["prefill_from"],
                 "throughput_from_tokens": r["throughput_from"] // w if r["throughput_from"] < NEVER else NEVER}
        switches[("moe", w)] = {**table.switches_for("moe", w), **tuned}
    return SelectionTable(dict(table.rows), table.source, dict(table.picks), switches)
