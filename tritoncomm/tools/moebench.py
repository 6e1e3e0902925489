"""MoE dispatch and combine measured (bench ``--op moe``): ``MoEAllToAll`` against what engines run.

For each shape and token count per rank (random top-k routing, a fresh draw on every rank):

* tritoncomm: ``dispatch``, ``dispatch + combine`` (the expert buffer as ``y``; ``combine`` is their
  difference), in CUDA graphs (32 calls per graph) and eager; bf16 and FP8 dispatch; with bf16, also
  with each combine mode forced (``*_latency_us``, ``*_throughput_us``); and as engines call it
  (``tritoncomm_engine_us``, bf16): one instance per shape sized for the run's largest token count,
  each call given ``tokens_bound`` = its token count. Checked first with identity experts:
  per-expert counts equal a torch count of the gathered routing, nothing dropped, and
  ``combine(dispatch(x)) == x * sum_j w[t, j]`` within the dtype's rounding.
* (a) ``nccl_a2a``: the counts (tokens per rank, entries per expert) exchanged and synced to the host
  once, then one ``all_to_all_single`` of each token once per destination rank with its ids and
  weights in the same row, laid out per expert by a stable sort; combine: each rank sums its
  experts' weighted outputs per received token, the reverse all-to-all, the source sums. Eager
  (the host sync rules out graphs), as engines run it; its combine is timed on its own, on one
  dispatch's output. Checked like ours (``_check_a2a``).
* (b) ``nccl_agrs``: all-gather of the tokens and routing, reduce-scatter of the outputs, through the
  default group (NCCL), in CUDA graphs: the communication only (an engine's fused MoE kernel reads the
  gathered tokens in place; its routing work is not timed here).
* (c) ``tc_agrs``: the same through tritoncomm's ``AllGather`` and ``ReduceScatter``.

Per row: the slowest rank's median, and GB/s of unique payload per rank (``tokens * hidden * 2``
bytes each way). The ``both`` rows also count the slow replays (``*_slow_replays``: samples of more
than ``SLOW_REPLAY`` times their timing's median, on any rank) of ours and of (b) and (c) (their
dispatch's and combine's timings together): medians hide stalls. A baseline that the group's
backend cannot run (gloo's missing reduce-scatter in the CPU world) shows "-".
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..channels import Communicator
from ..collectives import AllGather, MoEAllToAll, ReduceScatter
from ..config import CommConfig
from ..launch import RankContext
from .report import all_true, device_name, fmt, max_over_ranks
from .timing import time_per_call_us

__all__ = ["MOE_SHAPES", "bench_capacity", "format_moe", "measure_us", "moe_rank", "tc_agrs"]

#: name: (hidden, experts, top_k)
MOE_SHAPES = {"deepseek-v3": (7168, 256, 8), "qwen3-moe": (4096, 128, 8), "tiny": (256, 16, 4)}
#: backend: (shapes, tokens per rank). On GPUs the counts cover where each dispatch path starts (the
#: one-kernel dispatch up to 256 tokens of top-8 in the prefill shape, the route and send kernels from
#: 384) and where the combine switches mode.
DEFAULTS = {"cuda": (("deepseek-v3", "qwen3-moe"), (1, 8, 128, 256, 384, 512, 1024, 2048, 4096)),
            "cpu": (("tiny",), (1, 8, 32))}


def bench_capacity(world: int, tokens: int, experts: int, k: int) -> int:
    """Slots per expert that random routing does not overflow (mean + 10 sd + 16), at most every token."""
    mean = world * tokens * k / experts
    return min(world * tokens, math.ceil(mean + 10 * math.sqrt(mean) + 16))


class _A2A:
    """Baseline (a): NCCL all-to-all, the counts exchanged first and synced to the host once, as
    engines' normal (non-graph) expert-parallel path does it.

    ``dispatch``: per destination rank, its token count and its entries per local expert go in one
    small all-to-all; one host sync reads both directions' counts, so every later size is known and
    nothing else syncs. Each token goes once to each rank that holds one of its experts, its ids
    and weights packed into the same row (one all-to-all of ``hidden + 4 * top_k`` bf16 columns);
    the receiver lays its entries out per local expert, in (source, token, j) order, by a stable
    sort. ``combine``: each rank puts its experts' outputs back at their (token, j) places and sums
    them weighted per received token in one batched matrix-vector product (fp32 accumulation, bf16
    weights), the reverse all-to-all, the source sums."""

    def __init__(self, ctx: RankContext, local: int) -> None:
        self.ctx, self.local = ctx, local

    def dispatch(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx, local, g = self.ctx, self.local, self.ctx.group
        t, k = ids.shape
        hidden = x.shape[1]
        dest = ids // local
        goes = torch.zeros(t, ctx.world, dtype=torch.bool, device=x.device)
        goes.scatter_(1, dest, True)
        counts = torch.cat([goes.sum(0, dtype=torch.int64)[:, None],
                            torch.bincount(ids.flatten(), minlength=ctx.world * local).view(ctx.world, local)], 1)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=g)
        both = torch.stack([counts, recv_counts]).cpu()  # the one host sync
        sc, rc = both[0, :, 0].tolist(), both[1, :, 0].tolist()
        entries = int(both[1, :, 1:].sum())
        # tokens by destination rank, then token: the first sum(sc) of a stable sort of "not going"
        t_idx = torch.argsort((~goes.t()).flatten().to(torch.int8), stable=True)[:sum(sc)] % t
        packed = torch.cat([x, ids.to(torch.int32).view(x.dtype), w.to(torch.float32).view(x.dtype)], 1)
        recv = packed.new_empty(sum(rc), packed.shape[1])
        dist.all_to_all_single(recv, packed[t_idx], rc, sc, group=g)
        r_ids = recv[:, hidden:hidden + 2 * k].contiguous().view(torch.int32)
        r_w = recv[:, hidden + 2 * k:].contiguous().view(torch.float32)
        e = r_ids - ctx.rank * local
        key = torch.where((e >= 0) & (e < local), e, local).flatten()
        order = torch.argsort(key, stable=True)[:entries]  # entries of local experts, by expert
        self.state = (t_idx, sc, rc, order, r_w, t)
        return recv[order // k, :hidden]  # rows grouped by local expert

    def combine(self, y: torch.Tensor) -> torch.Tensor:
        t_idx, sc, rc, order, r_w, n = self.state
        rows, k = r_w.shape
        # each output back at its (token, j) place (zero elsewhere), then the weighted sum per token as
        # a batched matrix-vector product (fp32 accumulation, as engines' MoE sum does it)
        yk = y.new_zeros(rows * k, y.shape[1]).index_copy_(0, order, y)
        partial = torch.bmm(r_w.to(y.dtype).view(rows, 1, k), yk.view(rows, k, -1)).view(rows, -1)
        back = y.new_empty(sum(sc), y.shape[1])
        dist.all_to_all_single(back, partial, sc, rc, group=self.ctx.group)
        return torch.zeros(n, y.shape[1], device=y.device).index_add_(0, t_idx, back.float()).to(y.dtype)


def _check_ours(ctx: RankContext, moe: MoEAllToAll, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                bound: int | None = None) -> bool:
    out, counts, h = moe.dispatch(x, ids, w, tokens_bound=bound)
    vals = out if not moe.fp8 else \
        (out[0].float().view(*out[0].shape[:-1], -1, 128) * out[1][..., None]).view(out[0].shape).to(x.dtype)
    moe.expert_buffer().copy_(vals)
    comb = moe.combine(moe.expert_buffer(), h).float()
    everyone = [torch.empty_like(ids) for _ in range(ctx.world)]
    dist.all_gather(everyone, ids, group=ctx.group)
    want_counts = torch.bincount(torch.cat(everyone).flatten(), minlength=moe.num_experts)
    mine = want_counts[ctx.rank * moe.local_experts:(ctx.rank + 1) * moe.local_experts]
    want = x.float() * w.float().sum(1, keepdim=True)
    tol = 0.08 if moe.fp8 else 0.02
    if ctx.backend == "cuda":
        torch.cuda.synchronize(ctx.device)
    err = ((comb - want).abs().max() / want.abs().max()).item()
    return bool(torch.equal(counts.long(), mine) and moe.dropped() == 0 and err < tol)


def _check_a2a(ctx: RankContext, a2a: _A2A, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> bool:
    """Baseline (a) checked like ours: its rows are every rank's tokens of this rank's experts in
    (source, token, j) order, and ``combine`` of those rows gives ``x * sum_j w[t, j]``."""
    rows = a2a.dispatch(x, ids, w)
    xs = [torch.empty_like(x) for _ in range(ctx.world)]
    everyone = [torch.empty_like(ids) for _ in range(ctx.world)]
    dist.all_gather(xs, x, group=ctx.group)
    dist.all_gather(everyone, ids, group=ctx.group)
    e = torch.cat(everyone) - ctx.rank * a2a.local
    key = torch.where((e >= 0) & (e < a2a.local), e, a2a.local).flatten()
    order = torch.argsort(key, stable=True)[:int((key < a2a.local).sum())]
    want_rows = torch.cat(xs)[order // ids.shape[1]]
    comb = a2a.combine(rows).float()
    want = x.float() * w.float().sum(1, keepdim=True)
    err = ((comb - want).abs().max() / want.abs().max()).item()
    return bool(torch.equal(rows, want_rows) and err < 0.02)


#: A sample (one replay's µs per call) this many times its timing's median counts as a slow replay.
SLOW_REPLAY = 10.0


def measure_us(ctx: RankContext, fn, mode: str, samples: list[float] | None = None) -> float:
    """``fn``'s time per call (``time_per_call_us``); a few calls only in the CPU world."""
    few = {} if ctx.backend == "cuda" else {"replays": 2, "warmup": 1, "calls": 2}  # the CPU world times nothing real
    return time_per_call_us(fn, ctx.device, ctx.barrier, mode=mode, samples_out=samples, **few)


def _time_and_slow(ctx: RankContext, fn, mode: str) -> tuple[float | None, int]:
    """The median µs per call (None where the backend lacks the collective) and the count of samples
    over ``SLOW_REPLAY`` times that median."""
    samples: list[float] = []
    try:
        us = measure_us(ctx, fn, mode, samples)
    except (RuntimeError, ValueError, NotImplementedError):  # a backend without the collective
        return None, 0
    return us, sum(x > SLOW_REPLAY * us for x in samples)


def _time(ctx: RankContext, fn, mode: str) -> float | None:
    """The median µs per call, or None where the backend lacks the collective."""
    return _time_and_slow(ctx, fn, mode)[0]


def _case(ctx: RankContext, comm: Communicator, shape: str, t: int, engine: MoEAllToAll) -> list[dict[str, Any]]:
    """The rows of one shape and token count (see the module docstring); ``engine``: the shape's
    instance sized for the run's largest token count."""
    cuda = ctx.backend == "cuda"
    graph = "graph" if cuda else "eager"
    hidden, experts, k = MOE_SHAPES[shape]
    gen = torch.Generator(device=ctx.device).manual_seed(1000 * t + ctx.rank)
    x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
    ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
    w = torch.rand(t, k, device=ctx.device, generator=gen)
    cap = bench_capacity(ctx.world, t, experts, k)
    times: dict[str, float | None] = {}
    ok = True
    for fp8, mode in ((False, "auto"), (True, "auto"), (False, "latency"), (False, "throughput")):
        moe = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k, capacity=cap,
                          fp8_dispatch=fp8, mode=mode)
        ok &= _check_ours(ctx, moe, x, ids, w)
        sfx = "_fp8" if fp8 else "" if mode == "auto" else "_" + mode

        def both(moe: MoEAllToAll = moe) -> None:
            _, _, h = moe.dispatch(x, ids, w)
            moe.combine(moe.expert_buffer(), h)

        times["dispatch" + sfx] = _time(ctx, lambda moe=moe: moe.dispatch(x, ids, w), graph)
        times["both" + sfx], times["slow_both" + sfx] = _time_and_slow(ctx, both, graph)
        times["both_eager" + sfx] = _time(ctx, both, "eager") if cuda and mode == "auto" else None
        moe.close()
    ok &= _check_ours(ctx, engine, x, ids, w, bound=t)

    def engine_both() -> None:
        _, _, h = engine.dispatch(x, ids, w, tokens_bound=t)
        engine.combine(engine.expert_buffer(), h)

    times["both_engine"] = _time(ctx, engine_both, graph)
    a2a = _A2A(ctx, experts // ctx.world)
    ok &= _check_a2a(ctx, a2a, x, ids, w)
    times["a2a_dispatch"] = _time(ctx, lambda: a2a.dispatch(x, ids, w), "eager")
    times["a2a_both"] = _time(ctx, lambda: a2a.combine(a2a.dispatch(x, ids, w)), "eager")
    y = a2a.dispatch(x, ids, w)  # combine timed on its own: a difference of two eager timings can go negative
    times["a2a_combine"] = _time(ctx, lambda: a2a.combine(y), "eager")
    meta = torch.cat([ids.float(), w], 1)
    xs = x.new_empty(ctx.world * t, hidden)
    metas = meta.new_empty(ctx.world * t, 2 * k)
    part = x.new_empty(t, hidden)

    def nccl_ag() -> None:
        dist.all_gather_into_tensor(xs, x, group=ctx.group)
        dist.all_gather_into_tensor(metas, meta, group=ctx.group)

    times["agrs_dispatch"], slow_bd = _time_and_slow(ctx, nccl_ag, graph)
    times["agrs_combine"], slow_bc = _time_and_slow(
        ctx, lambda: dist.reduce_scatter_tensor(part, xs, group=ctx.group), graph)
    tc_dispatch, tc_combine, tc_close = tc_agrs(comm, x, meta, xs, metas, part)
    times["tc_dispatch"], slow_cd = _time_and_slow(ctx, tc_dispatch, graph)
    times["tc_combine"], slow_cc = _time_and_slow(ctx, tc_combine, graph)
    times["slow_agrs"], times["slow_tc"] = slow_bd + slow_bc, slow_cd + slow_cc
    tc_close()
    m = max_over_ranks(ctx, times)
    ok = all_true(ctx, ok)
    rows = []
    for sfx in ("", "_fp8"):
        ours = {"dispatch": m["dispatch" + sfx], "combine": _sub(m["both" + sfx], m["dispatch" + sfx]),
                "both": m["both" + sfx]}
        base = {"dispatch": (m["a2a_dispatch"], m["agrs_dispatch"], m["tc_dispatch"]),
                "combine": (m["a2a_combine"], m["agrs_combine"], m["tc_combine"]),
                "both": (m["a2a_both"], _add(m["agrs_dispatch"], m["agrs_combine"]),
                         _add(m["tc_dispatch"], m["tc_combine"]))}
        for op, us in ours.items():
            a, b, c = base[op]
            forced = {} if sfx or op == "dispatch" else {
                f"tritoncomm_{mode}_us": m["both_" + mode] if op == "both" else
                _sub(m["both_" + mode], m["dispatch_" + mode]) for mode in ("latency", "throughput")}
            payload = t * hidden * 2 * (2 if op == "both" else 1)
            rows.append({"op": op, "dispatch_dtype": "fp8" if sfx else "bf16", "shape": shape, "tokens": t,
                         "hidden": hidden, "experts": experts, "top_k": k, "capacity": cap, "tritoncomm_us": us,
                         "tritoncomm_eager_us": m["both_eager" + sfx] if op == "both" else None,
                         "tritoncomm_engine_us": m["both_engine"] if op == "both" and not sfx else None,
                         **forced,
                         **({"tritoncomm_slow_replays": int(m["slow_both" + sfx]),
                             "nccl_agrs_slow_replays": int(m["slow_agrs"]),
                             "tc_agrs_slow_replays": int(m["slow_tc"])} if op == "both" else {}),
                         "nccl_a2a_us": a, "nccl_agrs_us": b, "tc_agrs_us": c,
                         "gbps": payload / us / 1e3 if cuda and us and us > 0 else None, "correct": ok})
    return rows


def tc_agrs(comm: Communicator, x: torch.Tensor, meta: torch.Tensor, xs: torch.Tensor, metas: torch.Tensor,
            part: torch.Tensor) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """Baseline (c) on ``comm``: ``(dispatch, combine, close)``, our all-gather of the tokens ``x``
    into ``xs`` and of the routing ``meta`` into ``metas``, and our reduce-scatter of ``xs`` into
    ``part``."""
    ag = AllGather(comm, max_bytes=xs.numel() * xs.element_size())
    ag_meta = AllGather(comm, max_bytes=metas.numel() * metas.element_size(), name="allgather.meta")
    rs = ReduceScatter(comm, max_bytes=xs.numel() * xs.element_size())

    def dispatch() -> None:
        ag(x, xs)
        ag_meta(meta, metas)

    def close() -> None:
        for c in (ag, ag_meta, rs):
            c.close()

    return dispatch, lambda: rs(xs, part), close


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def moe_rank(ctx: RankContext, shapes: list[str] | None = None, tokens: list[int] | None = None,
             heap_bytes: int | None = None) -> dict[str, Any] | None:
    d_shapes, d_tokens = DEFAULTS[ctx.backend]
    cuda = ctx.backend == "cuda"
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap_bytes or ((6 << 30) if cuda else 64 << 20)))
    tokens = tokens or d_tokens
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    for shape in shapes or d_shapes:
        hidden, experts, k = MOE_SHAPES[shape]
        most = max(tokens)
        engine = MoEAllToAll(comm, max_tokens=most, hidden=hidden, num_experts=experts, top_k=k,
                             capacity=bench_capacity(ctx.world, most, experts, k))
        for t in tokens:
            rows += _case(ctx, comm, shape, t, engine)
            if ctx.rank == 0:  # progress, so that a run cut short shows how far it got
                print(f"bench --op moe: {shape} at {t} tokens per rank measured "
                      f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
        engine.close()
    comm.close()
    if ctx.rank:
        return None
    return {"op": "moe", "world": ctx.world, "backend": ctx.backend, "device": device_name(ctx),
            "date": datetime.date.today().isoformat(),
            "timing": "CUDA graphs (32 calls per graph), median of 20 replays, slowest rank; nccl_a2a eager"
            if cuda else "CPU world: wall clock of interpreted kernels (not speed)", "rows": rows}


def format_moe(rep: dict[str, Any]) -> str:
    out = [f"MoE dispatch/combine, EP{rep['world']}, {rep['device']}, {rep['date']} ({rep['timing']})",
           f"{'shape':>12} {'tokens':>6} {'op':>8} {'wire':>4} {'tritoncomm':>10} {'GB/s':>6} {'latency':>8} "
           f"{'thruput':>8} {'engine':>7} {'nccl a2a':>9} {'nccl ag/rs':>10} {'tc ag/rs':>9} ok"]
    for r in rep["rows"]:
        out.append(f"{r['shape']:>12} {r['tokens']:>6} {r['op']:>8} {r['dispatch_dtype']:>4} "
                   f"{fmt(r['tritoncomm_us'], '10.1f')} {fmt(r['gbps'], '6.0f')} "
                   f"{fmt(r.get('tritoncomm_latency_us'), '8.1f')} {fmt(r.get('tritoncomm_throughput_us'), '8.1f')} "
                   f"{fmt(r.get('tritoncomm_engine_us'), '7.1f')} "
                   f"{fmt(r['nccl_a2a_us'])} "
                   f"{fmt(r['nccl_agrs_us'], '10.1f')} {fmt(r['tc_agrs_us'])} {'yes' if r['correct'] else 'NO'}")
    slow = [f"{r['shape']} {r['tokens']} {r['dispatch_dtype']}: ours {r['tritoncomm_slow_replays']}, "
            f"nccl ag/rs {r['nccl_agrs_slow_replays']}, tc ag/rs {r['tc_agrs_slow_replays']}"
            for r in rep["rows"] if r["op"] == "both" and (r["tritoncomm_slow_replays"] or r["nccl_agrs_slow_replays"]
                                                          or r["tc_agrs_slow_replays"])]
    out.append(f"slow replays (samples over {SLOW_REPLAY:g}x their median): " + ("; ".join(slow) or "none"))
    return "\n".join(out)
