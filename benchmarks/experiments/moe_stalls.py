"""Where the rare slow graph replays of MoE dispatch + combine come from: ours against baselines, with
every rank's host times.

    python3 benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe --tokens 384 \
        [--cases ours,ours+no-pdl,ours@128,tc,nccl] [--rounds 3] [--replays 20] [--trace] [--json out.json]
        [--backend cpu]

Each case is timed in turn, ``rounds`` times: a CUDA graph of 32 calls, then ``replays`` samples,
each a host barrier, a warm replay and a timed one (as ``tools.timing`` does). Every rank keeps, per
sample, its µs per call (CUDA events around the timed replay) and three host clocks (``time.time_ns``,
one clock on one machine): after the barrier, before the timed replay and after it was issued.
A slow sample whose ranks left the barrier or issued the timed replay far apart points at the hosts;
one whose hosts kept step points at the GPUs. Cases: ``ours`` (``MoEAllToAll``, the default shape;
``+no-pdl``, ``+FIELD=VALUE`` change it, ``+dispatch`` times dispatches alone; ``@T`` times ``T``
tokens per rank instead), ``tc`` (our
all-gather of the tokens and routing, then our reduce-scatter: the bench's (c)), ``nccl`` (the same
through NCCL: the bench's (b)). With ``--trace`` the ``ours`` cases run with stage stamps
(``MoEAllToAll.trace_stages``, one row per call of the graph; other builds than the default) and
every rank keeps, for each slow sample and the first fast one, per call and stage the earliest,
median and latest program's global timer (ns): which call of a slow replay took the time, and in
which stage on which rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from tritoncomm.channels import Communicator
from tritoncomm.collectives import MoEAllToAll
from tritoncomm.collectives.moe import default_shape
from tritoncomm.config import CommConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.tools.moebench import MOE_SHAPES, bench_capacity, tc_agrs

CALLS = 32
SLOW_US = 1000.0  # a sample this slow per call is a stall, not noise


def _inputs(ctx, shape: str, t: int):
    hidden, experts, k = MOE_SHAPES[shape]
    gen = torch.Generator(device=ctx.device).manual_seed(1000 * t + ctx.rank)
    x = torch.randn(t, hidden, device=ctx.device, generator=gen).to(torch.bfloat16)
    ids = torch.rand(t, experts, device=ctx.device, generator=gen).topk(k).indices
    w = torch.rand(t, k, device=ctx.device, generator=gen)
    return x, ids, w


class _Stamps:
    """The stage stamps of an instance's calls (``MoEAllToAll.trace_stages``, a row per call)."""

    def __init__(self, moe: MoEAllToAll, alone: bool) -> None:
        self.moe, self.alone = moe, alone
        self.path, self.launched = moe.dispatch_path(None)
        self.arm()  # from the first call on: the warm-up builds the traced kernels before any capture

    def arm(self) -> None:
        """Rows for the next ``CALLS`` calls, in order: called just before a graph's capture, row ``i``
        holds the graph's ``i``-th call."""
        self.traces = self.moe.trace_stages(calls=CALLS)

    def read(self) -> list:
        """Per row (call), per stage, the (earliest, median, latest) program's global timer ns."""
        p = self.launched.programs
        d = self.traces[2 if self.path.startswith("routed") else 0][:, :p, :, 0]
        # [calls, programs, stages]: the dispatch's, then the combine's
        both = (d if self.alone else torch.cat([d, self.traces[1][:, :p, :, 0]], 2)).double()
        q = torch.quantile(both.transpose(1, 2), torch.tensor([0.0, 0.5, 1.0], dtype=torch.double, device=both.device),
                           dim=2)
        return q.permute(1, 2, 0).long().tolist()


def _case(ctx, comm: Communicator, shape: str, tokens: int, case: str, trace: bool = False):
    """``(fn, closer, stamps)`` for one case: ``stamps`` a ``_Stamps`` (ours with ``trace``) or None."""
    name, _, at = case.partition("@")
    t = int(at) if at else tokens
    hidden, experts, k = MOE_SHAPES[shape]
    x, ids, w = _inputs(ctx, shape, t)
    parts = name.split("+")
    if parts[0] == "ours":
        sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.backend == "cuda" else 1
        sh = default_shape(ctx.backend, t, sms, hidden=hidden, world=ctx.world)
        alone = "dispatch" in parts[1:]
        for change in parts[1:]:
            if change == "dispatch":
                continue
            if change == "no-pdl":
                sh = replace(sh, pdl=False)
            else:
                field, value = change.split("=")
                sh = replace(sh, **{field: int(value)})
        moe = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k,
                          capacity=bench_capacity(ctx.world, t, experts, k), shape=sh)
        def ours() -> None:
            _, _, h = moe.dispatch(x, ids, w)
            if not alone:
                moe.combine(moe.expert_buffer(), h)

        return ours, moe.close, _Stamps(moe, alone) if trace else None
    meta = torch.cat([ids.float(), w], 1)
    xs = x.new_empty(ctx.world * t, hidden)
    metas = meta.new_empty(ctx.world * t, 2 * k)
    part = x.new_empty(t, hidden)
    if parts[0] == "nccl":
        def nccl() -> None:
            dist.all_gather_into_tensor(xs, x, group=ctx.group)
            dist.all_gather_into_tensor(metas, meta, group=ctx.group)
            dist.reduce_scatter_tensor(part, xs, group=ctx.group)

        return nccl, lambda: None, None
    dispatch, combine, close = tc_agrs(comm, x, meta, xs, metas, part)

    def tc() -> None:
        dispatch()
        combine()

    return tc, close, None


def _keep(out: list, kept: dict[int, list], stamps: _Stamps | None) -> None:
    """Keep the stamps of the sample just taken if it was slow, or the first fast one."""
    if stamps is not None and (out[-1][0] > SLOW_US or not any(out[j][0] <= SLOW_US for j in kept)):
        kept[len(out) - 1] = stamps.read()


def _samples(ctx, fn, replays: int, stamps: _Stamps | None = None) -> tuple[list[tuple[float, int, int, int]],
                                                                            dict[int, list]]:
    """Per sample: (µs per call, host ns after the barrier, before the timed replay, after issuing it);
    and, where ``stamps`` is given, the stamps of the slow samples and of the first fast one. In the
    CPU world: two plain calls per sample, timed on the host (a check that the script runs)."""
    out, kept = [], {}
    if ctx.backend != "cuda":
        if stamps is not None:
            stamps.arm()
        for _ in range(replays):
            ctx.barrier()
            h0 = time.time_ns()
            fn()
            h1 = time.time_ns()
            fn()
            h2 = time.time_ns()
            out.append(((h2 - h1) / 1e3, h0, h1, h2))
            _keep(out, kept, stamps)
        return out, kept
    stream = torch.cuda.Stream(ctx.device)
    stream.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(ctx.device).wait_stream(stream)
    torch.cuda.synchronize(ctx.device)
    if stamps is not None:
        stamps.arm()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        torch.cuda.synchronize(ctx.device)
        ctx.barrier()
        h0 = time.time_ns()
        graph.replay()
        start.record()
        h1 = time.time_ns()
        graph.replay()
        end.record()
        h2 = time.time_ns()
        end.synchronize()
        out.append((start.elapsed_time(end) * 1e3 / CALLS, h0, h1, h2))
        _keep(out, kept, stamps)
    del graph
    return out, kept


def _rank(ctx, shape: str, tokens: int, cases: list[str], rounds: int, replays: int, trace: bool = False):
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=(2 << 30) if ctx.backend == "cuda" else 64 << 20))
    built = {c: _case(ctx, comm, shape, tokens, c, trace) for c in cases}
    mine: dict[str, list] = {c: [] for c in cases}
    traced: dict[str, dict[int, list]] = {c: {} for c in cases}  # sample index: stamps
    for _ in range(rounds):
        for c, (fn, _, stamps) in built.items():
            got, kept = _samples(ctx, fn, replays, stamps)
            traced[c].update({len(mine[c]) + i: v for i, v in kept.items()})
            mine[c].extend(got)
    for _, close, _ in built.values():
        close()
    comm.close()
    every: list = [None] * ctx.world
    dist.all_gather_object(every, {"samples": mine, "stamps": traced}, group=ctx.cpu_group)
    return every if ctx.rank == 0 else None


def _print_stamps(case: str, stamps: list[dict[int, list]], slow: list[int]) -> None:
    """For the first slow sample with stamps on every rank: per rank, the call that took longest
    (its first dispatch program's start to its last combine program's end, ms) and, in it, the stage
    whose latest program came furthest after the stage before's."""
    both = [i for i in slow if all(i in s for s in stamps)]
    if not both:
        return
    i = both[0]
    for r, s in enumerate(stamps):
        calls = s[i]  # [calls][stages][earliest, median, latest]
        spans = [(call[-1][2] - call[0][0]) / 1e6 for call in calls]
        worst = max(range(len(calls)), key=spans.__getitem__)
        st = calls[worst]
        jump = max(range(1, len(st)), key=lambda j: st[j][2] - st[j - 1][2])
        print(f"    {case} sample {i}, rank {r}: call {worst} took {spans[worst]:.3f} ms (median call "
              f"{statistics.median(spans):.3f}); its stage {jump} came {(st[jump][2] - st[jump - 1][2]) / 1e6:.3f} "
              f"ms after stage {jump - 1} (latest programs); first start {calls[0][0][0]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"], help="cpu: a check that the script runs")
    p.add_argument("--shape", default="qwen3-moe", choices=sorted(MOE_SHAPES))
    p.add_argument("--tokens", type=int, default=384)
    p.add_argument("--cases", default="ours,ours+no-pdl,ours@128,tc,nccl")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--trace", action="store_true", help="stage stamps of the ours cases' slow samples")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    cases = a.cases.split(",")
    with LocalWorld(a.world, a.backend) as world:
        every = world.run(_rank, a.shape, a.tokens, cases, a.rounds, a.replays, a.trace, timeout=600)[0]
    dev = torch.cuda.get_device_name(0) if a.backend == "cuda" else "the CPU world (not speed)"
    print(f"{a.shape} EP{a.world}, {a.tokens} tokens per rank, on {dev}: per case, the "
          f"median µs per call (slowest rank), samples slower than {SLOW_US:.0f} µs per call on any rank, and for "
          f"those the spread of the ranks' host clocks (ms) after the barrier and before the timed replay")
    for c in cases:
        per_rank = [every[r]["samples"][c] for r in range(a.world)]
        n = len(per_rank[0])
        worst = [max(per_rank[r][i][0] for r in range(a.world)) for i in range(n)]
        slow = [i for i in range(n) if worst[i] > SLOW_US]
        spread = [(max(per_rank[r][i][1] for r in range(a.world)) - min(per_rank[r][i][1] for r in range(a.world)),
                   max(per_rank[r][i][2] for r in range(a.world)) - min(per_rank[r][i][2] for r in range(a.world)))
                  for i in slow]
        fast = [worst[i] for i in range(n) if i not in slow]
        line = f"{c:<28} median {statistics.median(worst):9.2f}  slow {len(slow):3d}/{n}"
        if slow:
            line += (f"  slow µs/call {min(worst[i] for i in slow):.0f}-{max(worst[i] for i in slow):.0f}"
                     f"  barrier spread {max(s[0] for s in spread) / 1e6:.2f} ms, replay spread "
                     f"{max(s[1] for s in spread) / 1e6:.2f} ms")
        if fast:
            line += f"  (fast median {statistics.median(fast):.2f})"
        print(line)
        _print_stamps(c, [every[r]["stamps"][c] for r in range(a.world)], slow)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": a.shape, "world": a.world, "tokens": a.tokens, "cases": cases, "ranks": every}, f)


if __name__ == "__main__":
    main()
