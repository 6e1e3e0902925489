"""Benchmarks of the tensor-parallel building blocks, each against its baseline in the same run:

* ``norm``: fused all-reduce + residual add + RMSNorm vs our bare all-reduce of the same bytes and
  vs NCCL all-reduce followed by torch's add and ``F.rms_norm``;
* ``gemm``: row-parallel GEMM + all-reduce (overlapped kernel, and cuBLAS + our all-reduce) vs
  ``torch.matmul`` followed by NCCL all-reduce (Llama-70B MLP down-projection shapes);
* ``decoder``: a decode step (batch 1-64, KV cache) and a 2048-token prefill through Llama-70B-shaped
  decoder layers, tritoncomm vs NCCL for every reduction;
* ``hier``: hierarchical all-reduce as 2 "nodes" x 2 GPUs vs NCCL over the same 4 GPUs.

Method: per call inside CUDA graphs (``timing.time_per_call_us``), each rank's median, max over
ranks. Every part checks its result against the baseline's before timing. The CPU world runs
small shapes (a smoke test of the code, not a measurement).
"""

# ruff: noqa: B023  (the closures below are timed at once, inside the iteration that made them)

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..channels import Communicator
from ..collectives import FUSED_ALGORITHMS, AllReduce, FusedAllReduceAddRMSNorm, GemmAllReduce, GemmConfig
from ..config import CommConfig
from ..launch import RankContext
from .peers import FlashInferAllReduce, FlashInferReducer, flashinfer_missing
from .report import all_true, max_over_ranks, same_on_all_ranks
from .timing import time_per_call_us

__all__ = ["format_layers", "layers_rank"]


def _shapes(cuda: bool, world: int) -> dict[str, Any]:
    if cuda:
        return {"hidden": 8192, "tokens": [1, 8, 32, 128, 512, 2048], "k": 28672 // world, "n": 8192,
                "gemm_m": [1, 16, 64, 512, 2048, 8192], "gemm_chunks": [2], "gemm_side_programs": [32],
                "gemm_variants": {"overlap_defer": {"defer": True}, "overlap_rb16": {"rows_per_step": 16},
                                  "overlap_rb128": {"rows_per_step": 128}}, "gemm_rounds": 3,
                "gemm_chunk_min_m": 512, "heads": 64, "kv_heads": 8, "inter": 28672, "layers": 4,
                "batches": [1, 4, 16, 64], "context": 1024, "prefill": 2048,
                "hier_sizes": [8 << 10, 128 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20]}
    return {"hidden": 256, "tokens": [1, 5], "k": 64, "n": 48, "gemm_m": [3, 20], "gemm_chunks": [2],
            "gemm_side_programs": [None, 1], "gemm_variants": {"overlap_defer": {"defer": True}},
            "gemm_rounds": 1, "gemm_chunk_min_m": 4, "heads": 4, "kv_heads": 4,
            "inter": 128, "layers": 1, "batches": [1, 2], "context": 8, "prefill": 8, "hier_sizes": [4096]}


class _Timer:
    def __init__(self, ctx: RankContext, cuda: bool) -> None:
        self.ctx, self.cuda = ctx, cuda

    def __call__(self, fn, *, calls: int = 32, replays: int = 20) -> float:
        if not self.cuda:
            calls, replays = 1, 2
        return time_per_call_us(fn, self.ctx.device, self.ctx.barrier, calls=calls, replays=replays)


def _norm_part(ctx: RankContext, comm: Communicator, sh: dict, timer: _Timer) -> list[dict]:
    h, dev = sh["hidden"], ctx.device
    ar = AllReduce(comm, max_bytes=max(sh["tokens"]) * h * 2, name="bench.norm.ar")
    fused = FusedAllReduceAddRMSNorm(comm, max_tokens=max(sh["tokens"]), max_hidden=h, name="bench.norm",
                                     algos=tuple(FUSED_ALGORITHMS))
    selected = FusedAllReduceAddRMSNorm(comm, max_tokens=max(sh["tokens"]), max_hidden=h, name="bench.norm.sel")
    whole_rows = FusedAllReduceAddRMSNorm(comm, max_tokens=max(sh["tokens"]), max_hidden=h, name="bench.norm1",
                                          max_chunks=1)
    fi = FlashInferAllReduce(ctx, max(sh["tokens"]), h) if ctx.backend == "cuda" else None
    scale = torch.full((1,), 0.05, dtype=torch.float32, device=dev)  # a static FP8 scale, as vLLM passes it
    rows = []
    for t in sh["tokens"]:
        g = torch.Generator(device=dev).manual_seed(t + 17 * ctx.rank)
        x = torch.randn(t, h, device=dev, generator=g).to(torch.bfloat16)
        res0 = torch.randn(t, h, device=dev, generator=torch.Generator(device=dev).manual_seed(t)).to(torch.bfloat16)
        w = torch.rand(h, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).to(torch.bfloat16) + 0.5
        # correctness: fused vs NCCL + torch
        res_a, res_b, xb = res0.clone(), res0.clone(), x.clone()
        y = fused(x, res_a, w)
        dist.all_reduce(xb, group=ctx.group)
        res_b.add_(xb)
        yb = F.rms_norm(res_b, (h,), w, 1e-6)
        ok = bool(torch.allclose(y.float(), yb.float(), rtol=3e-2, atol=3e-2)) and same_on_all_ranks(ctx, y)
        for a in fused.algorithms:  # every variant timed below gives the same answer
            if t * h * 2 <= fused.capacity[a]:
                ya = fused(x, res0.clone(), w, algo=a)
                ok = ok and bool(torch.allclose(ya.float(), yb.float(), rtol=3e-2, atol=3e-2))
                ok = ok and same_on_all_ranks(ctx, ya)
        res, out, xo = res0.clone(), torch.empty_like(x), torch.empty_like(x)
        t_fused = timer(lambda: selected(x, res, w, out=out))
        variants = {a: timer(lambda a=a: fused(x, res, w, out=out, algo=a)) for a in fused.algorithms
                    if t * h * 2 <= fused.capacity[a]}
        variants["whole_rows"] = timer(lambda: whole_rows(x, res, w, out=out))
        t_bare = timer(lambda: ar(x, out=xo))

        def base(xb=xb, res_b=res_b) -> None:
            dist.all_reduce(xb, group=ctx.group)
            res_b.add_(xb)
            F.rms_norm(res_b, (h,), w, 1e-6)
        t_base = timer(base)
        peer: dict[str, float | None] = {"fi": None, "fi_fp8": None}
        out8 = torch.empty(t, h, dtype=torch.float8_e4m3fn, device=dev)
        peer["f8"] = timer(lambda: selected(x, res, w, out=out8, fp8_scale=scale))
        if fi is not None and fi.ws is not None:  # FlashInfer's fused op, as vLLM's fusion pass calls it
            r_in, r_out, norm = res0.clone(), torch.empty_like(x), torch.empty_like(x)
            fi.add_rms_norm(x, r_in, r_out, norm, w, 1e-6)()
            ok = ok and bool(torch.allclose(norm.float(), yb.float(), rtol=3e-2, atol=3e-2))
            peer["fi"] = timer(fi.add_rms_norm(x, r_in, r_out, norm, w, 1e-6))
            peer["fi_fp8"] = timer(fi.add_rms_norm(x, r_in, r_out, norm, w, 1e-6, fp8=(out8, scale)))
        v = max_over_ranks(ctx, {"f": t_fused, "b": t_bare, "n": t_base, **variants, **peer})
        rows.append({"op": "allreduce_add_rmsnorm", "shape": [t, h], "dtype": "bf16", "variant": selected.select(t, h),
                     "tritoncomm_us": v["f"], "baseline_us": v["n"],
                     "baseline": "NCCL all_reduce + torch add + F.rms_norm", "bare_allreduce_us": v["b"],
                     "ratio_to_bare": v["f"] / v["b"], "speedup": v["n"] / v["f"], "correct": all_true(ctx, ok),
                     "tritoncomm_fp8_us": v["f8"], "flashinfer_us": v["fi"], "flashinfer_fp8_us": v["fi_fp8"],
                     **{f"{a}_us": v[a] for a in variants}})
    if fi is not None:
        fi.close()
    whole_rows.close()
    selected.close()
    fused.close()
    ar.close()
    return rows


def _gemm_part(ctx: RankContext, comm: Communicator, sh: dict, timer: _Timer) -> list[dict]:
    dev, k, n, ms = ctx.device, sh["k"], sh["n"], sh["gemm_m"]
    ar = AllReduce(comm, max_bytes=max(ms) * n * 2, name="bench.gemm.ar")
    op = GemmAllReduce(comm, max(ms), n, config=GemmConfig.for_backend(comm.backend), allreduce=ar,
                       name="bench.gemm.op")
    cuda = comm.backend == "cuda"
    # chunked path: slices x the program cap of the slices' all-reduce (None: the table's shape)
    chunked = [(c, p) for c in sh["gemm_chunks"] for p in sh["gemm_side_programs"]]

    def label(c: int, p: int | None) -> str:
        return f"chunked{c}" + (f"_p{p}" if p else "")

    w = (torch.randn(n, k, device=dev, generator=torch.Generator(device=dev).manual_seed(3 + ctx.rank)) /
         math.sqrt(k)).to(torch.bfloat16)
    rows = []
    regs = []  # registered outputs stay allocated (a freed one's address could come back unregistered)
    for m in ms:
        x = torch.randn(m, k, device=dev, generator=torch.Generator(device=dev).manual_seed(m + ctx.rank))
        x = x.to(torch.bfloat16)
        ref = torch.matmul(x, w.t())
        dist.all_reduce(ref, group=ctx.group)
        mine = [(c, p) for c, p in chunked if m >= sh["gemm_chunk_min_m"] and m >= c]
        # a registered output (what engines get inside comm.graph_capture): peers store into it
        reg = torch.empty(m, n, dtype=torch.bfloat16, device=dev) if cuda else comm.empty((m, n))
        comm.register(reg)
        regs.append(reg)
        outs = {"overlap": op(x, w, path="overlap"), "plain": op(x, w, path="plain"),
                "overlap_reg": op(x, w, out=reg, path="overlap").clone(), "plain_reg": op(x, w, out=reg, path="plain")}
        for c, p in mine:
            outs[label(c, p)] = op(x, w, path="chunked", chunks=c, side_programs=p)
        scale = ref.float().abs().max().item()
        ok = all(bool(((o.float() - ref.float()).abs().max() / scale) < 2e-2) and same_on_all_ranks(ctx, o)
                 for o in outs.values())
        ok = ok and torch.equal(outs["overlap"], outs["overlap_reg"]) and torch.equal(outs["plain"], outs["plain_reg"])
        big = m * k * n >= 1 << 34
        kw = {"calls": 4, "replays": 6} if big else {"calls": 16, "replays": 10}
        o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        base_cfg = op.cfg

        def variant(cfg: GemmConfig, out: torch.Tensor):
            def run() -> None:  # called at capture: the graph keeps the variant's kernel
                op.cfg = cfg
                try:
                    op(x, w, out=out, path="overlap")
                finally:
                    op.cfg = base_cfg
            return run

        def base() -> None:
            torch.matmul(x, w.t(), out=o)
            dist.all_reduce(o, group=ctx.group)

        fns = {"overlap": lambda: op(x, w, out=o, path="overlap"), "plain": lambda: op(x, w, out=o, path="plain"),
               "overlap_reg": lambda: op(x, w, out=reg, path="overlap"),
               "plain_reg": lambda: op(x, w, out=reg, path="plain"),
               **{label(c, p): (lambda c=c, p=p: op(x, w, out=o, path="chunked", chunks=c, side_programs=p))
                  for c, p in mine},
               "gemm_only": lambda: torch.matmul(x, w.t(), out=o), "triton_gemm_only": lambda: op.local_gemm(x, w, o),
               "base": base}
        for name, change in sh["gemm_variants"].items():  # the overlapped kernel's launch variants
            cfg = dataclasses.replace(base_cfg, **change)  # same tile sizes: the same workspace layout
            op.cfg = cfg
            try:
                outs[name] = op(x, w, path="overlap")
            finally:
                op.cfg = base_cfg
            fns[name], fns[name + "_reg"] = variant(cfg, o), variant(cfg, reg)
        ok = ok and all(torch.equal(outs[name], outs["overlap"]) for name in sh["gemm_variants"])
        # rounds: every path once per round, median over rounds (the GEMMs run at the power limit and
        # their clocks drift; interleaving keeps a drift from favouring whichever path ran first)
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(sh["gemm_rounds"] if m >= 512 else 1):
            for name, fn in fns.items():
                samples[name].append(timer(fn, **kw))
        t: dict[str, float | None] = {name: statistics.median(v) for name, v in samples.items()}
        v = max_over_ranks(ctx, t)
        paths = ["plain", *(label(*spec) for spec in mine), "overlap"]
        best = min(paths, key=lambda q: v[q] or math.inf)
        # what the library runs by default: its selected path with its own chunked settings
        sel = op.select(m, k)
        chosen = label(op.chunks, op.side_programs) if sel == "chunked" else sel
        if chosen not in v:
            raise RuntimeError(f"the selected path {chosen} was not timed; add it to the sweep")
        rows.append({"op": "gemm_allreduce", "shape": [m, k, n], "dtype": "bf16", "path": chosen,
                     "tritoncomm_us": v[chosen], "baseline_us": v["base"], "baseline": "torch.matmul + NCCL all_reduce",
                     "tritoncomm_registered_us": v.get(f"{chosen}_reg", v[chosen]), "best_path": best,
                     **{f"{q}_us": v[q] for q in (*paths, "overlap_reg", "plain_reg", "gemm_only", "triton_gemm_only")},
                     **{f"{q}_us": v[q] for name in sh["gemm_variants"] for q in (name, name + "_reg")},
                     "speedup": v["base"] / v[chosen],
                     "speedup_registered": v["base"] / v.get(f"{chosen}_reg", v[chosen]),
                     "correct": all_true(ctx, ok)})
    op.close()
    ar.close()
    if not cuda:
        for reg in regs:
            comm.free(reg)
    return rows


def _layer_weights(sh: dict, layer: int, dev: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(1000 + layer)
    h, d = sh["hidden"], sh["hidden"] // sh["heads"]

    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=dev, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16)

    return {"wq": r(sh["heads"] * d, h), "wk": r(sh["kv_heads"] * d, h), "wv": r(sh["kv_heads"] * d, h),
            "wo": r(h, sh["heads"] * d), "gate": r(sh["inter"], h), "up": r(sh["inter"], h), "down": r(h, sh["inter"]),
            "input_norm": torch.ones(h, device=dev, dtype=torch.bfloat16),
            "post_norm": torch.ones(h, device=dev, dtype=torch.bfloat16)}


def _decoder_part(ctx: RankContext, comm: Communicator, sh: dict, timer: _Timer) -> list[dict]:
    from ..integrations.tp import LlamaDecoderLayer, TorchReducer, TritonCommReducer

    dev, h, w = ctx.device, sh["hidden"], ctx.world
    reducers = {"tritoncomm": TritonCommReducer(comm, max_tokens=sh["prefill"], hidden=h),
                "nccl": TorchReducer(ctx.group)}
    if ctx.backend == "cuda" and flashinfer_missing() is None:  # what an engine with FlashInfer runs
        reducers["flashinfer"] = FlashInferReducer(ctx, sh["prefill"], h)
    models = {}
    for name, red in reducers.items():
        layers = []
        for i in range(sh["layers"]):
            layers.append(LlamaDecoderLayer(_layer_weights(sh, i, dev), sh["heads"], sh["kv_heads"], red).to(dev))
            if comm.backend == "cuda":
                torch.cuda.empty_cache()  # the full (unsharded) weights of this layer are garbage now
        models[name] = layers
    d = h // sh["heads"]
    kvl = sh["kv_heads"] // w
    cases = [("decode_step", b, 1, sh["context"]) for b in sh["batches"]] + [("prefill", 1, sh["prefill"], 0)]
    rows = []
    for op, b, t, ctx_len in cases:
        g = torch.Generator(device=dev).manual_seed(b * 7 + t)
        x0 = torch.randn(b, t, h, device=dev, generator=g).to(torch.bfloat16)
        # a decode step's cache: ctx_len past tokens plus the slot the step writes its own K/V into
        caches = [(torch.randn(b, kvl, ctx_len + 1, d, device=dev, generator=g).to(torch.bfloat16),
                   torch.randn(b, kvl, ctx_len + 1, d, device=dev, generator=g).to(torch.bfloat16))
                  for _ in range(sh["layers"])] if ctx_len else [None] * sh["layers"]
        res, outs, times = {}, {}, {}
        for name, layers in models.items():
            residual = torch.zeros_like(x0)

            def step(layers=layers, residual=residual) -> torch.Tensor:
                residual.zero_()
                p = x0
                for layer, cache in zip(layers, caches, strict=True):
                    p = layer(p, residual, cache)
                return p

            with torch.no_grad():
                outs[name] = step().clone()
                res[name] = residual.clone()
                kw = {"calls": 2, "replays": 8} if t > 1 else {"calls": 4, "replays": 10}
                times[name] = timer(step, **kw)
        ours, theirs = res["tritoncomm"].float(), res["nccl"].float()  # NCCL sums in bf16 hop by hop, we in fp32
        ok = bool(((ours - theirs).abs().max() / theirs.abs().max()) < 3e-2)
        ok = ok and same_on_all_ranks(ctx, res["tritoncomm"])
        v = max_over_ranks(ctx, times)
        tokens = b * t
        rows.append({"op": op, "shape": {"batch": b, "tokens": t, "hidden": h, "layers": sh["layers"],
                                          "context": ctx_len}, "tritoncomm_us": v["tritoncomm"],
                     "baseline_us": v["nccl"], "baseline": "NCCL (torch.distributed) + torch add/RMSNorm",
                     "tritoncomm_tok_s": tokens / (v["tritoncomm"] * 1e-6),
                     "baseline_tok_s": tokens / (v["nccl"] * 1e-6),
                     "speedup": v["nccl"] / v["tritoncomm"], "correct": all_true(ctx, ok),
                     "flashinfer_us": v.get("flashinfer"),
                     "speedup_vs_flashinfer": v["flashinfer"] / v["tritoncomm"] if v.get("flashinfer") else None})
    for red in reducers.values():
        if hasattr(red, "close"):
            red.close()
    return rows


def _hier_part(ctx: RankContext, sh: dict, timer: _Timer) -> list[dict]:
    from ..integrations.hierarchical import HierarchicalAllReduce, node_groups

    if ctx.world != 4:
        return []
    groups = node_groups(local_world=2, backend=dist.get_backend(ctx.group))
    har = HierarchicalAllReduce(groups, max_bytes=max(sh["hier_sizes"]), device=ctx.device,
                                config=CommConfig(heap_bytes=4 * max(sh["hier_sizes"]) + (64 << 20)))
    rows = []
    for nbytes in sh["hier_sizes"]:
        x = torch.randn(nbytes // 2, device=ctx.device,
                        generator=torch.Generator(device=ctx.device).manual_seed(nbytes + ctx.rank)).to(torch.bfloat16)
        ref = x.float()
        dist.all_reduce(ref, group=ctx.group)
        got = har(x)
        ok = bool(((got.float() - ref).abs().max() / ref.abs().max()) < 2e-2) and same_on_all_ranks(ctx, got)
        xb = x.clone()
        v = max_over_ranks(ctx, {"h": timer(lambda: har(x)),
                                  "n": timer(lambda: dist.all_reduce(xb, group=ctx.group))})
        rows.append({"op": "hier_allreduce_2x2", "bytes": nbytes, "dtype": "bf16", "tritoncomm_us": v["h"],
                     "baseline_us": v["n"], "baseline": "NCCL all_reduce over the 4 GPUs", "speedup": v["n"] / v["h"],
                     "correct": all_true(ctx, ok)})
    har.close()
    return rows


def layers_rank(ctx: RankContext, parts: list[str]) -> dict[str, Any] | None:
    """Run the named parts (``norm``, ``gemm``, ``decoder``, ``hier``) on every rank; rank 0 returns
    ``{part: report}``."""
    cuda = ctx.backend == "cuda"
    sh = _shapes(cuda, ctx.world)
    timer = _Timer(ctx, cuda)
    heap = (3 << 30) if cuda else (48 << 20)
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=heap, timeout_s=60))
    reports: dict[str, Any] = {}
    meta = {"device": torch.cuda.get_device_name(ctx.device) if cuda else "CPU world (smoke test, not a measurement)",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__, "world": ctx.world,
            "method": "per call in CUDA graphs (norm: 32 calls, gemm: 4-16, decoder: 2-4 steps per graph), median "
                      "of 6-20 replays per rank (gemm from M = 512: median of 3 interleaved rounds of that), max over "
                      "ranks; baseline in the same run"}
    try:
        import triton

        meta["triton"] = triton.__version__
        for part in parts:
            if part == "norm":
                rows = _norm_part(ctx, comm, sh, timer)
            elif part == "gemm":
                rows = _gemm_part(ctx, comm, sh, timer)
            elif part == "decoder":
                rows = _decoder_part(ctx, comm, sh, timer)
            elif part == "hier":
                rows = _hier_part(ctx, sh, timer)
            else:
                raise ValueError(f"unknown part {part!r} (norm, gemm, decoder, hier)")
            reports[part] = {**meta, "part": part, "rows": rows}
    finally:
        comm.close()
    return reports if ctx.rank == 0 else None


def format_layers(rep: dict[str, Any]) -> str:
    lines = [f"{rep['part']}: world={rep['world']} device={rep['device']} date={rep['date']}"]
    for r in rep["rows"]:
        shape = r.get("shape", r.get("bytes"))
        extra = ""
        if "ratio_to_bare" in r:
            extra = f" bare_ar={r['bare_allreduce_us']:.1f}us ratio_to_bare={r['ratio_to_bare']:.2f} [{r['variant']}]"
        elif "best_path" in r:
            extra = (f" [{r['path']}; best {r['best_path']}] overlap={r['overlap_us']:.1f} plain={r['plain_us']:.1f} "
                     f"gemm_only={r['gemm_only_us']:.1f}")
        elif "tritoncomm_tok_s" in r:
            extra = f" tok/s {r['tritoncomm_tok_s']:.0f} vs {r['baseline_tok_s']:.0f}"
        lines.append(f"  {r['op']:22s} {shape!s:42s} tritoncomm {r['tritoncomm_us']:9.1f} us  baseline "
                     f"{r['baseline_us']:9.1f} us  x{r['speedup']:.2f}  correct={r['correct']}{extra}")
    return "\n".join(lines)
