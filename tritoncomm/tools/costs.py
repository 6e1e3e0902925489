"""What reliability costs per call, measured side by side: ``bench --op costs``.

The same call on communicators that differ in one setting only:

* all-reduce (the table's pick per size): wait bound on and call check on (the default), bound off
  (``timeout_s=0``), call check off (``check_calls=False``), in CUDA graphs; debug mode on and off,
  eagerly (debug synchronises each call);
* the fused all-reduce + add + RMSNorm (the table's variant per token count): call check on and off,
  in CUDA graphs;
* MoE dispatch + combine (DeepSeek-V3's shape on GPUs: hidden 7168, 256 experts, top-8; a tiny one in
  the CPU world), one instance sized for the most tokens, each count passed as ``tokens_bound``: call
  check on and off, in CUDA graphs.

Both sides of each pair alternate over two rounds and keep their better one, so drift spreads over
both.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch

from ..channels import Communicator
from ..collectives import AllReduce, FusedAllReduceAddRMSNorm, MoEAllToAll
from ..collectives.moe import heap_bytes_bound
from ..config import CommConfig
from ..launch import RankContext
from .report import max_over_ranks
from .timing import time_per_call_us

__all__ = ["format_cost", "reliability_cost_rank"]

#: The fused norm's rows: hidden 8192 (TP2 of a 70B-class model) on GPUs, narrow ones in the CPU world.
NORM_HIDDEN = {"cuda": 8192, "cpu": 64}
NORM_TOKENS = {"cuda": [1, 16, 128, 512, 2048], "cpu": [1, 4]}
#: MoE: (hidden, experts, top-k) and tokens per rank.
MOE_SHAPE = {"cuda": (7168, 256, 8), "cpu": (64, 8, 2)}
MOE_TOKENS = {"cuda": [1, 8, 128, 512, 4096], "cpu": [1, 4]}


def _best_of_two(fns: dict[str, Any], ctx: RankContext, mode: str = "graph") -> dict[str, float]:
    """``fns``' times per call (µs), alternating two rounds and keeping each one's better."""
    t: dict[str, float] = {}
    for _ in range(2):
        for name, fn in fns.items():
            v = time_per_call_us(fn, ctx.device, ctx.barrier, mode=mode)
            t[name] = min(v, t.get(name, v))
    return t


def _allreduce_rows(ctx: RankContext, sizes: list[int], heap: int) -> list[dict[str, Any]]:
    comms = {name: Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap, **cfg))
             for name, cfg in (("bounded", {}), ("unbounded", {"timeout_s": 0.0}),
                               ("unchecked", {"check_calls": False}), ("debug", {"debug": True}))}
    ars = {name: AllReduce(c, max_bytes=max(sizes)) for name, c in comms.items()}
    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
        out = torch.empty_like(x)
        graph = _best_of_two({f"{n}_graph_us": lambda ar=ars[n], x=x, out=out: ar(x, out)
                              for n in ("bounded", "unbounded", "unchecked")}, ctx)
        eager = _best_of_two({f"{n}_eager_us": lambda ar=ars[n], x=x, out=out: ar(x, out)
                              for n in ("bounded", "debug")}, ctx, mode="eager")
        t = max_over_ranks(ctx, {**graph, **eager})
        rows.append({"bytes": nbytes, "algo": ars["bounded"].select(nbytes), **t,
                     "bounded_cost_pct": 100 * (t["bounded_graph_us"] / t["unbounded_graph_us"] - 1),
                     "check_cost_pct": 100 * (t["bounded_graph_us"] / t["unchecked_graph_us"] - 1),
                     "debug_cost_us": t["debug_eager_us"] - t["bounded_eager_us"]})
    for ar in ars.values():
        ar.close()
    for c in comms.values():
        c.close()
    return rows


def _checked_pair(ctx: RankContext, heap: int, build: Callable[[Communicator], Any]) -> dict[bool, Any]:
    """``build``'s instance on a communicator with the call check on (key True) and one without."""
    return {on: build(Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap, check_calls=on)))
            for on in (True, False)}


def _close_pair(pair: dict[bool, Any]) -> None:
    for obj in pair.values():
        comm = obj.comm
        obj.close()
        comm.close()


def _timed_pair(ctx: RankContext, pair: dict[bool, Any], call: Callable[[Any], None]) -> dict[str, float]:
    """``call`` on each of the pair, timed (``_best_of_two``, slowest rank): ``checked_us``,
    ``unchecked_us`` and the check's cost in percent."""
    v = max_over_ranks(ctx, _best_of_two({("checked_us" if on else "unchecked_us"): lambda o=o: call(o)
                                          for on, o in pair.items()}, ctx))
    return {**v, "check_cost_pct": 100 * (v["checked_us"] / v["unchecked_us"] - 1)}


def _norm_rows(ctx: RankContext, tokens: list[int], hidden: int) -> list[dict[str, Any]]:
    norms = _checked_pair(ctx, max(64 << 20, 8 * max(tokens) * hidden * 2),
                          lambda c: FusedAllReduceAddRMSNorm(c, max_tokens=max(tokens), max_hidden=hidden))
    dev = ctx.device
    w = torch.rand(hidden, device=dev).to(torch.bfloat16) + 0.5
    rows = []
    for t in tokens:
        x = torch.randn(t, hidden, device=dev).to(torch.bfloat16)
        res, out = torch.randn_like(x), torch.empty_like(x)
        v = _timed_pair(ctx, norms, lambda n, x=x, res=res, out=out: n(x, res, w, out=out))
        rows.append({"tokens": t, "hidden": hidden, "variant": norms[True].select(t, hidden), **v})
    _close_pair(norms)
    return rows


def _moe_rows(ctx: RankContext, tokens: list[int]) -> list[dict[str, Any]]:
    hidden, experts, k = MOE_SHAPE[ctx.backend]
    experts = max(experts // ctx.world, 1) * ctx.world
    m = max(tokens)
    heap = heap_bytes_bound(ctx.backend, ctx.device, ctx.world, max_tokens=m, hidden=hidden, num_experts=experts,
                            top_k=k) + (64 << 20)
    moes = _checked_pair(ctx, heap, lambda c: MoEAllToAll(c, max_tokens=m, hidden=hidden, num_experts=experts,
                                                          top_k=k))
    dev = ctx.device
    rows = []
    for t in tokens:
        g = torch.Generator(device=dev).manual_seed(t + 31 * ctx.rank)
        x = torch.randn(t, hidden, device=dev, generator=g).to(torch.bfloat16)
        ids = torch.rand(t, experts, device=dev, generator=g).topk(k).indices
        w = torch.rand(t, k, device=dev, generator=g)

        def pair(moe, x=x, ids=ids, w=w, t=t) -> None:
            _, _, h = moe.dispatch(x, ids, w, tokens_bound=t)
            moe.combine(moe.expert_buffer(), h)
        rows.append({"tokens": t, "hidden": hidden, "experts": experts, "top_k": k,
                     "path": moes[True].dispatch_path(t)[0], **_timed_pair(ctx, moes, pair)})
    _close_pair(moes)
    return rows


def reliability_cost_rank(ctx: RankContext, sizes: list[int] | None = None, tokens: list[int] | None = None,
                          moe_tokens: list[int] | None = None) -> dict[str, Any] | None:
    """Every rank runs it; rank 0 returns the report (module docstring)."""
    sizes = sizes or [8 << 10, 1 << 20]
    tokens = tokens or NORM_TOKENS[ctx.backend]
    rows = _allreduce_rows(ctx, sizes, max(64 << 20, 5 * max(sizes)))
    norm_rows = _norm_rows(ctx, tokens, NORM_HIDDEN[ctx.backend])
    moe_rows = _moe_rows(ctx, moe_tokens or MOE_TOKENS[ctx.backend])
    if ctx.rank != 0:
        return None
    import triton

    return {"op": "reliability_cost", "world": ctx.world, "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "CPU world",
            "torch": torch.__version__, "triton": triton.__version__,
            "method": "per call; graph: 32 calls in a CUDA graph, eager: 32 launches; median of 20 samples per "
                      "rank, max over ranks, best of two alternating rounds", "rows": rows, "norm_rows": norm_rows,
            "moe_rows": moe_rows}


def format_cost(rep: dict[str, Any]) -> str:
    lines = [f"reliability cost: world={rep['world']} device={rep['device']} date={rep['date']} "
             f"torch={rep.get('torch')} triton={rep.get('triton')}; {rep['method']}",
             f"{'bytes':>9} {'algo':>15} {'bounded':>8} {'unbounded':>9} {'cost%':>6} {'unchecked':>9} {'check%':>6} "
             f"{'eager':>8} {'debug':>8} {'debug+us':>8}"]
    for r in rep["rows"]:
        lines.append(f"{r['bytes']:>9} {r['algo']:>15} {r['bounded_graph_us']:8.2f} {r['unbounded_graph_us']:9.2f} "
                     f"{r['bounded_cost_pct']:6.1f} {r['unchecked_graph_us']:9.2f} {r['check_cost_pct']:6.1f} "
                     f"{r['bounded_eager_us']:8.2f} {r['debug_eager_us']:8.2f} {r['debug_cost_us']:8.2f}")
    lines.append(f"{'tokens':>9} {'hidden':>6} {'variant':>12} {'checked':>8} {'unchecked':>9} {'check%':>6}")
    for r in rep.get("norm_rows", []):
        lines.append(f"{r['tokens']:>9} {r['hidden']:>6} {r['variant']:>12} {r['checked_us']:8.2f} "
                     f"{r['unchecked_us']:9.2f} {r['check_cost_pct']:6.1f}")
    lines.append(f"{'moe tokens':>10} {'path':>13} {'checked':>8} {'unchecked':>9} {'check%':>6}")
    for r in rep.get("moe_rows", []):
        lines.append(f"{r['tokens']:>10} {r['path']:>13} {r['checked_us']:8.2f} {r['unchecked_us']:9.2f} "
                     f"{r['check_cost_pct']:6.1f}")
    return "\n".join(lines)
