"""Where transformers' static-cache generation spends its time with the ``tritoncomm`` backend.

``bench --op model`` runs the static-cache variant (transformers compiles the forward with
``mode="reduce-overhead"``, i.e. inductor with CUDA graph trees) after the eager one; on two H200s it
did not finish within its call. This runs only that path, one phase at a time, and prints how long
each phase took on every rank: loading, an eager generation, the first static generation
(compilation and graph capture), then timed static generations. Every ``--dump-s`` seconds each rank
prints its Python stacks (``faulthandler``), so a phase that never ends shows where it waits.

``--shared`` puts every rank on GPU ``rank % count`` (``TRITONCOMM_SHARED_GPUS=1``): on one GPU
this checks that the path completes and gives the same tokens on every rank; its times are
time-sliced and never a speed. NCCL refuses ranks that share a GPU, so ``--backend nccl`` needs one
GPU per rank.

    python3 benchmarks/experiments/model_static.py --world 2 --shared --backend tritoncomm

``--profile`` then has every rank generate 8 tokens with the static cache under the profiler (CPU
and CUDA activity); rank 0 prints its busiest host ops and how often each collective op and
``cudaGraphLaunch`` ran: a collective that runs on the host at every step was not captured in the
decode step's CUDA graph.
With ``TORCH_LOGS=perf_hints`` inductor also says why it skipped CUDA graphs, where it did.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from tritoncomm.integrations.backend import register
from tritoncomm.launch import end_rank, join_ranks
from tritoncomm.tools.backendbench import MODEL_CONFIG


def _timed(model: Any, prompt: torch.Tensor, n: int, meet: Any, **kw: Any) -> tuple[float, list[int]]:
    torch.cuda.synchronize()
    dist.barrier(group=meet)
    t0 = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out[0].tolist()


def _job(rank: int, args: argparse.Namespace, port: int, path: str, q: Any) -> None:
    gpu = rank % torch.cuda.device_count()  # transformers puts the rank on GPU LOCAL_RANK
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(gpu), WORLD_SIZE=str(args.world))
    if args.shared:
        os.environ["TRITONCOMM_SHARED_GPUS"] = "1"
    faulthandler.dump_traceback_later(args.dump_s, repeat=True, file=sys.stderr)
    torch.cuda.set_device(gpu)
    register()
    backend = f"cpu:gloo,cuda:{args.backend}"
    dist.init_process_group(backend, rank=rank, world_size=args.world, init_method=f"tcp://127.0.0.1:{port}")
    meet = dist.new_group(backend="gloo")  # a CPU barrier: NCCL (the backend's inner one) refuses shared GPUs
    res: dict[str, Any] = {"rank": rank, "backend": args.backend, "phases_s": {}}
    phases = res["phases_s"]
    try:
        from transformers import AutoModelForCausalLM, DistributedConfig, LlamaConfig, LlamaForCausalLM

        t = time.perf_counter()
        if rank == 0 and not os.path.exists(os.path.join(path, "config.json")):
            torch.manual_seed(0)
            with torch.device("cuda"):
                LlamaForCausalLM(LlamaConfig(**MODEL_CONFIG)).to(torch.bfloat16).save_pretrained(path)
        dist.barrier(group=meet)
        model = AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_plan="auto", tp_size=args.world), dtype=torch.bfloat16)
        prompt = torch.tensor([[1, 306, 4658, 278, 6593, 310, 2834, 338]], device=model.device)
        res["model_device"] = str(model.device)
        phases["load"] = time.perf_counter() - t
        phases["eager"], res["eager_tokens"] = _timed(model, prompt, args.tokens, meet)
        print(f"rank {rank}: eager {phases['eager']:.1f} s", flush=True)
        phases["static_first"], res["static_tokens"] = _timed(model, prompt, args.tokens, meet,
                                                              cache_implementation="static")
        print(f"rank {rank}: first static generation {phases['static_first']:.1f} s", flush=True)
        for i in range(args.repeats):
            phases[f"static_{i + 1}"], tokens = _timed(model, prompt, args.tokens, meet, cache_implementation="static")
            res.setdefault("static_repeat_same", True)
            res["static_repeat_same"] &= tokens == res["static_tokens"]
        if args.profile:  # every rank generates (collectives); rank 0 reports
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               cache_implementation="static")
                torch.cuda.synchronize()
            ev = prof.key_averages()
        if args.profile and rank == 0:
            res["profile"] = ev.table(sort_by="self_cpu_time_total", row_limit=20)
            res["op_counts"] = {e.key: e.count for e in ev if any(w in e.key.lower() for w in
                                ("all_reduce", "allreduce", "all_gather", "allgather", "wait_tensor",
                                 "cudagraphlaunch", "tritoncomm", "nccl"))}
        from torch._dynamo.utils import counters

        res["dynamo"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "graph_break")}
        pg = dist.group.WORLD
        res["served"] = type(pg).__name__ == "TritonCommProcessGroup" and pg.comm is not None
    except Exception:
        res["error"] = traceback.format_exc()[-3000:]
    finally:
        faulthandler.cancel_dump_traceback_later()
        q.put(res)
        end_rank()  # a rank that stalls in its teardown or exit prints its stacks and ends


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--backend", default="tritoncomm", choices=("tritoncomm", "nccl"))
    p.add_argument("--shared", action="store_true", help="ranks share GPUs (correctness only)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dump-s", type=float, default=120.0, help="print every rank's stacks this often")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true", help="profile one static generation (rank 0 reports)")
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as path:
        procs = [ctx.Process(target=_job, args=(r, args, port, path, q)) for r in range(args.world)]
        for proc in procs:
            proc.start()
        results = sorted((q.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
        for r in results:  # before the ranks are joined: a rank that stalls at its exit cannot hide them
            _print_rank(r)
        for r, code in join_ranks(procs).items():
            results[r]["exit_stall"] = f"rank {r} reported, then did not exit cleanly (exit code {code})"
            print(results[r]["exit_stall"], flush=True)
    rep = {"device": torch.cuda.get_device_name(0), "world": args.world, "backend": args.backend,
           "shared": args.shared, "torch": torch.__version__, "ranks": results}
    ok = [r for r in results if "error" not in r]
    if len(ok) == len(results):
        rep["same_static_tokens_on_ranks"] = all(r["static_tokens"] == ok[0]["static_tokens"] for r in ok)
        rep["same_eager_tokens_on_ranks"] = all(r["eager_tokens"] == ok[0]["eager_tokens"] for r in ok)
        rep["static_equals_eager"] = ok[0]["static_tokens"] == ok[0]["eager_tokens"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    print({k: v for k, v in rep.items() if k != "ranks"})


def _print_rank(r: dict[str, Any]) -> None:
    print(f"rank {r['rank']}: " + ("error:\n" + r["error"] if "error" in r else
          " ".join(f"{k} {v:.1f}s" for k, v in r["phases_s"].items()) + f" served={r['served']} "
          f"dynamo={r['dynamo']}"), flush=True)
    if "profile" in r:
        print(r["profile"])
        print("op counts (8 tokens):", r["op_counts"], flush=True)


if __name__ == "__main__":
    main()
