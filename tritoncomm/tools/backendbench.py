"""The torch.distributed backend measured: what ``dist.all_reduce`` through a ``tritoncomm`` group
costs next to calling the same ``AllReduce`` directly and next to NCCL, and a Hugging Face
transformers model sharded by its own ``tp_plan`` with the backend and with NCCL.

``backend_rank`` (bench ``--op backend``): for each size, bf16, in place, each rank's median per call
(graph: 32 calls in one CUDA graph; eager: 32 launches back to back), max over ranks; the direct call
is the group's own ``AllReduce`` (same kernels, same heap), so the difference is the backend's
dispatch (c10d's Python dispatch, the served checks, the work object).

``model_rank`` (bench ``--op model``): fresh processes per backend (``init_process_group`` with
``cpu:gloo,cuda:tritoncomm`` and with ``cpu:gloo,cuda:nccl``); a Llama-architecture model built from a
config with random weights (no download), ``tp_plan="auto"``; greedy generation of 64 tokens, checked
equal across backends; the time per decode step is ``(t(64 tokens) - t(1 token)) / 63``, median of
three, max over ranks; eager, then with transformers' static cache (which compiles the forward;
``TRITONCOMM_BENCH_STATIC=0`` skips it; ``TRITONCOMM_BENCH_PROFILE=1`` adds rank 0's profile of 8 tokens;
every ``TRITONCOMM_BENCH_DUMP_S`` seconds, 240 by default, each rank prints its Python stacks).
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import statistics
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from .. import settings
from ..launch import RankContext, end_rank, join_ranks
from ..registration import register
from ..units import format_bytes
from .report import all_true, max_over_ranks
from .timing import time_per_call_us

__all__ = ["backend_rank", "format_backend", "format_model", "model_report"]

#: Sizes of the overhead comparison (the issue's range: 8 KB to 1 MB, and 2 KB below it).
BACKEND_SIZES = (2 << 10, 8 << 10, 32 << 10, 128 << 10, 512 << 10, 1 << 20)


def backend_rank(ctx: RankContext, sizes: list[int] | None = None) -> dict[str, Any] | None:
    register()
    sizes = list(sizes or BACKEND_SIZES)
    g = dist.new_group(backend="tritoncomm")
    if g.comm is None:
        raise RuntimeError("the tritoncomm group serves nothing on this machine (probe failed)")
    rows, cuda = [], ctx.backend == "cuda"
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=ctx.device).to(torch.bfloat16)
        want = x.clone()
        dist.all_reduce(want, group=ctx.group)  # NCCL (gloo in the CPU world)
        y = x.clone()
        dist.all_reduce(y, group=g)
        # at two ranks NCCL's sum is ours bit for bit (one rounding of a + b); beyond, within a rounding
        same = torch.equal(y, want) if ctx.world == 2 else torch.allclose(y.float(), want.float(), rtol=1e-2)
        row: dict[str, Any] = {}
        a, b, c = x.clone(), x.clone(), x.clone()
        calls = {"direct": lambda a=a: g.ar(a, a), "backend": lambda b=b: dist.all_reduce(b, group=g),
                 "nccl": lambda c=c: dist.all_reduce(c, group=ctx.group)}
        for mode in ("graph", "eager") if cuda else ("eager",):
            for name, fn in calls.items():
                host: list[float] = []
                row[f"{name}_{mode}_us"] = time_per_call_us(fn, ctx.device, ctx.barrier, mode=mode, host_out=host)
                if host:
                    row[f"{name}_{mode}_host_us"] = host[0]
        rows.append({"bytes": nbytes, **max_over_ranks(ctx, row), "correct": all_true(ctx, bool(same))})
    dist.destroy_process_group(g)
    if ctx.rank != 0:
        return None
    for r in rows:
        for mode in ("graph", "eager"):
            if f"backend_{mode}_us" in r:
                r[f"overhead_{mode}_us"] = r[f"backend_{mode}_us"] - r[f"direct_{mode}_us"]
                r[f"vs_nccl_{mode}"] = r[f"nccl_{mode}_us"] / r[f"backend_{mode}_us"]
    return {"op": "backend", "device": torch.cuda.get_device_name(ctx.device) if cuda else "CPU world",
            "date": datetime.date.today().isoformat(), "world": ctx.world, "torch": torch.__version__,
            "dtype": "bf16", "baseline": "NCCL" if cuda else "gloo", "rows": rows,
            "method": "dist.all_reduce in place through a tritoncomm group vs the group's AllReduce called "
                      "directly vs the default group (NCCL on GPUs); per call, 32 calls per CUDA graph or back "
                      "to back (eager; *_host_us: the host's time to issue them), median of 20, "
                      "max over ranks, one run"}


def format_backend(rep: dict[str, Any]) -> str:
    modes = [m for m in ("graph", "eager") if f"backend_{m}_us" in rep["rows"][0]]
    lines = [f"torch.distributed backend: {rep['device']}, world {rep['world']}, {rep['date']}, bf16, µs per call"]
    head = f"{'bytes':>8} " + " ".join(f"{m + ' ' + k:>17}" for m in modes
                                         for k in ("direct", "backend", "overhead", rep["baseline"],
                                                   "vs " + rep["baseline"]))
    lines.append(head + "  correct")
    for r in rep["rows"]:
        cells = []
        for m in modes:
            cells += [f"{r[f'direct_{m}_us']:17.2f}", f"{r[f'backend_{m}_us']:17.2f}",
                      f"{r[f'overhead_{m}_us']:17.2f}", f"{r[f'nccl_{m}_us']:17.2f}", f"{r[f'vs_nccl_{m}']:16.2f}x"]
        lines.append(f"{format_bytes(r['bytes']):>8} " + " ".join(cells) + f"  {r['correct']}")
    if "direct_eager_host_us" in rep["rows"][0]:
        lines.append("eager, host µs per call (issuing the launches): " + "; ".join(
            f"{format_bytes(r['bytes'])} " + " / ".join(f"{r[f'{k}_eager_host_us']:.1f}"
                                                        for k in ("direct", "backend", "nccl"))
            for r in rep["rows"]) + " (direct / backend / " + rep["baseline"] + ")")
    return "\n".join(lines)


# -- the model -------------------------------------------------------------------------------------------
#: A Llama-3-8B-shaped model with fewer layers (random weights, bf16).
MODEL_CONFIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 32000,
                "max_position_embeddings": 1024}
NEW_TOKENS = 64


def _decode_step_ms(model: Any, prompt: torch.Tensor, **kw: Any) -> tuple[float, list[int]]:
    def run(n: int) -> tuple[float, torch.Tensor]:
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    run(NEW_TOKENS)  # warm-up (and compilation, with the static cache)
    samples, tokens = [], None
    for _ in range(3):
        t_full, out = run(NEW_TOKENS)
        t_one, _ = run(1)
        samples.append((t_full - t_one) / (NEW_TOKENS - 1) * 1e3)
        tokens = out[0].tolist()
    return statistics.median(samples), tokens


def _model_job(rank: int, world: int, port: int, backend: str, path: str, q: Any) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    # a run that stalls shows where: every rank prints its stacks this often (to its stderr)
    faulthandler.dump_traceback_later(settings.BENCH_DUMP_S.get(), repeat=True)
    torch.cuda.set_device(rank)
    register()
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    result: dict[str, Any] = {"rank": rank, "backend": backend}
    try:
        from transformers import AutoModelForCausalLM, DistributedConfig, LlamaConfig, LlamaForCausalLM

        if rank == 0 and not os.path.exists(os.path.join(path, "config.json")):
            torch.manual_seed(0)
            with torch.device("cuda"):
                LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG)).to(torch.bfloat16).save_pretrained(path)
        dist.barrier()
        model = AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_plan="auto", tp_size=world), dtype=torch.bfloat16)
        prompt = torch.tensor([[1, 306, 4658, 278, 6593, 310, 2834, 338]], device=model.device)
        result["eager_ms"], result["tokens"] = _decode_step_ms(model, prompt)
        if not settings.BENCH_STATIC.get():
            result["static_error"] = "skipped (TRITONCOMM_BENCH_STATIC=0)"
        else:
            try:
                result["static_ms"], result["static_tokens"] = _decode_step_ms(model, prompt,
                                                                               cache_implementation="static")
            except Exception as e:  # reported, not hidden: what transformers/torch could not do here
                result["static_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if settings.BENCH_PROFILE.get() and rank == 0:  # where a decode step's host time goes
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            result["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        pg = dist.group.WORLD
        result["served"] = type(pg).__name__ == "TritonCommProcessGroup" and pg.comm is not None
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    finally:
        faulthandler.cancel_dump_traceback_later()
        q.put(result)
        end_rank()  # a rank that stalls in its teardown or exit prints its stacks and ends; reported below


def _spawn(world: int, backend: str, path: str) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mpc = mp.get_context("spawn")
    q = mpc.Queue()
    procs = [mpc.Process(target=_model_job, args=(r, world, port, backend, path, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=1200) for _ in procs), key=lambda r: r["rank"])
    for r, code in join_ranks(procs).items():  # stalled at exit (its stacks are on stderr) or killed
        results[r]["exit_stall"] = f"{backend}: rank {r} reported, then did not exit cleanly (exit code {code})"
    return results


def model_report(world: int = 2) -> dict[str, Any]:
    """Run the model with each backend (GPUs only) and compare; see the module docstring."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as path:
        for backend in ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:tritoncomm"):
            runs[backend] = _spawn(world, backend, path)
    errors = [r["error"] for rs in runs.values() for r in rs if "error" in r]
    rep: dict[str, Any] = {"op": "model", "device": torch.cuda.get_device_name(0),
                           "date": datetime.date.today().isoformat(), "world": world, "torch": torch.__version__,
                           "config": MODEL_CONFIG, "new_tokens": NEW_TOKENS, "errors": errors,
                           "method": "greedy generate; per decode step (t(64) - t(1)) / 63, median of 3, max "
                                     "over ranks; eager, then cache_implementation='static' (compiled forward)"}
    if errors:
        return rep
    for key, rs in runs.items():
        name = "tritoncomm" if "tritoncomm" in key else "nccl"
        rep[f"{name}_eager_ms"] = max(r["eager_ms"] for r in rs)
        static = [r.get("static_ms") for r in rs]
        rep[f"{name}_static_ms"] = None if None in static else max(static)
        rep[f"{name}_static_error"] = next((r["static_error"] for r in rs if "static_error" in r), None)
        rep[f"{name}_tokens"] = rs[0]["tokens"]
        rep[f"{name}_same_on_ranks"] = all(r["tokens"] == rs[0]["tokens"] for r in rs)
        if name == "tritoncomm":
            rep["served"] = all(r["served"] for r in rs)
        rep[f"{name}_static_tokens"] = rs[0].get("static_tokens")
        rep[f"{name}_profile"] = rs[0].get("profile")
    # ours fail the run; the baseline's (NCCL's ranks can stall at exit after the static cache,
    # docs/backend.md) are reported beside it
    for key, rs in runs.items():
        stalls = [r["exit_stall"] for r in rs if "exit_stall" in r]
        rep["exit_stalls" if "tritoncomm" in key else "nccl_exit_stalls"] = stalls
    rep["same_tokens"] = rep["tritoncomm_tokens"] == rep["nccl_tokens"]
    rep["same_static_tokens"] = rep["tritoncomm_static_tokens"] == rep["nccl_static_tokens"]
    return rep


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def format_model(rep: dict[str, Any]) -> str:
    if rep["errors"]:
        return "model: failed\n" + "\n".join(rep["errors"])
    profiles = "".join(f"\n{k}:\n{rep[k]}" for k in ("tritoncomm_profile", "nccl_profile") if rep.get(k))
    layers, t, n = rep["config"]["num_hidden_layers"], "tritoncomm", "nccl"
    return profiles + (
        f"\nmodel (Llama-shaped, {layers} layers, TP{rep['world']}, {rep['device']}, {rep['date']}): ms per decode "
        f"step, eager: tritoncomm {rep[t + '_eager_ms']:.3f} vs NCCL {rep[n + '_eager_ms']:.3f}; static cache + "
        f"compile: tritoncomm {_ms(rep[t + '_static_ms'])} vs NCCL {_ms(rep[n + '_static_ms'])} "
        f"({rep[t + '_static_error'] or 'ok'}); same tokens: eager {rep['same_tokens']}, static "
        f"{rep['same_static_tokens']}; served by tritoncomm: {rep.get('served')}") + "".join(
        f"\n{m}" for m in rep.get("exit_stalls", []) + rep.get("nccl_exit_stalls", []))
