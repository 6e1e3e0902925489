"""Command line: ``python -m tritoncomm {demo,bench,layers,tune} ...`` (``--help`` lists each one's options)."""

from __future__ import annotations

import argparse

from ..launch import LocalWorld, detect_backend, launch
from ..units import parse_size

DEFAULT_SIZES = {
    "cuda": "2K,8K,32K,128K,512K,1M,2M,8M,32M",
    "cpu": "1K,3000,16K,100000,256K",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritoncomm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="all-reduce correctness and timing table on local ranks")
    demo.add_argument("--world", type=int, default=None, help="ranks (default: 4, or the GPU count if fewer; "
                      "2 ranks sharing the GPU on a one-GPU machine)")
    demo.add_argument("--shared-gpus", action="store_true", help="let ranks share GPUs (time-sliced: correctness "
                      "only, nothing timed); on by default with one GPU")
    demo.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    demo.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    demo.add_argument("--sizes", default=None, help="comma-separated byte sizes, e.g. 2K,1M")
    demo.add_argument("--json", default=None, help="also write the report here")
    demo.add_argument("--no-timing", action="store_true", help="check correctness only")
    bench = sub.add_parser("bench", help="nccl-tests style benchmark against NCCL and torch symmetric memory")
    bench.add_argument("--op", default="allreduce", help="allreduce, allgather, reducescatter, alltoall, primitives, "
                       "costs, zerocopy, backend (the torch.distributed backend's cost per call), model (transformers "
                       "TP with the backend vs NCCL; GPUs), moe (expert-parallel dispatch/combine) or "
                       "deterministic (what the engines' deterministic modes run) (comma-separated)")
    bench.add_argument("--world", type=int, default=None)
    bench.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    bench.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    bench.add_argument("--sizes", default=None, help="comma-separated byte sizes (default: 2K..128M and odd ones)")
    bench.add_argument("--modes", default="graph,eager", help="graph and/or eager")
    bench.add_argument("--table", default=None, help="a table JSON from `tune` to use instead of the packaged one")
    bench.add_argument("--json", default=None, help="write the report(s) here (one file per op: {op} in the name)")
    bench.add_argument("--plot", default=None, help="write a PNG plot here")
    bench.add_argument("--tokens", default=None, help="moe: tokens per rank (default 1..4096); costs, "
                       "deterministic: the fused norm's token counts; comma-separated")
    bench.add_argument("--shapes", default=None, help="moe: deepseek-v3, qwen3-moe, tiny (comma-separated)")
    layers = sub.add_parser("layers", help="fused TP layers vs their baselines: norm, gemm, decoder, hier (2x2)")
    layers.add_argument("--parts", default="norm,gemm,decoder,hier")
    layers.add_argument("--world", type=int, default=None)
    layers.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    layers.add_argument("--json", default=None, help="write each part's report here ({part} in the name)")
    tune = sub.add_parser("tune", help="measure candidates under CUDA graphs and write the selection table")
    tune.add_argument("--world", type=int, default=None)
    tune.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    tune.add_argument("--op", default="allreduce,allgather,reducescatter",
                      help="allreduce, allgather, reducescatter, moe (launch shapes and combine mode)")
    tune.add_argument("--tokens", default=None, help="moe: tokens per rank, comma-separated")
    tune.add_argument("--shapes", default=None, help="moe: deepseek-v3, qwen3-moe, tiny (comma-separated)")
    tune.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    tune.add_argument("--sizes", default=None)
    tune.add_argument("--out", default=None, help="table JSON to write (merged with an existing file)")
    args = parser.parse_args(argv)
    problem = _problem(args)
    if problem:
        parser.error(problem)  # one line, exit 2, before any rank starts
    if args.cmd == "bench":
        return _bench(args)
    if args.cmd == "tune":
        return _tune(args)
    if args.cmd == "layers":
        return _layers(args)

    from .demo import demo_rank, format_table
    from .report import write_json

    backend = detect_backend() if args.backend == "auto" else args.backend
    world, shared = args.world, args.shared_gpus and backend == "cuda"
    if world is None:
        world = 4
        if backend == "cuda":
            import torch

            world = min(4, torch.cuda.device_count())
            if world < 2:  # one rank would check nothing: two ranks on the one GPU, correctness only
                world, shared = 2, True
    sizes = [parse_size(s) for s in (args.sizes or DEFAULT_SIZES[backend]).split(",")]
    print(f"starting {world} {backend} ranks{' sharing GPUs (correctness only)' if shared else ''} ...", flush=True)
    report = launch(demo_rank, world, sizes, args.dtype, not args.no_timing, backend=backend, timeout=1800,
                    shared_gpus=shared)[0]
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
    ok = all(r["correct"] and r["identical"] for r in report["rows"])
    return 0 if ok else 1


#: What each subcommand's list options accept (checked before any rank starts).
CHOICES = {
    ("bench", "op"): ("allreduce", "allgather", "reducescatter", "alltoall", "primitives", "costs", "zerocopy",
                      "backend", "model", "moe", "deterministic"),
    ("tune", "op"): ("allreduce", "allgather", "reducescatter", "moe"),
    ("bench", "modes"): ("graph", "eager"),
    ("layers", "parts"): ("norm", "gemm", "decoder", "hier"),
    ("bench", "shapes"): ("deepseek-v3", "qwen3-moe", "tiny"),
    ("tune", "shapes"): ("deepseek-v3", "qwen3-moe", "tiny"),
}

#: The CPU world's caveat, printed with every table it times.
CPU_CAVEAT = ("CPU world: kernels run in Triton's interpreter and NCCL's columns are gloo. A correctness harness: "
              "these times are not speed.")


def _problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    import os

    if getattr(args, "world", None) is not None and args.world < 2:
        return f"--world {args.world}: a collective needs at least 2 ranks"
    for (cmd, name), allowed in CHOICES.items():
        value = getattr(args, name, None) if args.cmd == cmd else None
        if value is not None:
            bad = [v for v in value.split(",") if v not in allowed]
            if bad or not value:
                return f"--{name} {value}: {', '.join(bad) or 'nothing'} not one of {', '.join(allowed)}"
    if getattr(args, "sizes", None):
        for text in args.sizes.split(","):
            try:
                if parse_size(text) < 1:
                    return f"--sizes: {text!r} is not a positive size"
            except ValueError:
                return f"--sizes: {text!r} is not a size (bytes, or a number with K, M or G: 2K,1M)"
    if getattr(args, "tokens", None):
        if not all(t.strip().isdigit() and int(t) > 0 for t in args.tokens.split(",")):
            return f"--tokens {args.tokens}: positive whole numbers, comma-separated"
    for name in ("json", "plot", "out"):
        path = getattr(args, name, None)
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            return f"--{name} {path}: no folder {folder}"
        if folder and not os.access(folder, os.W_OK):
            return f"--{name} {path}: folder {folder} is not writable"
    return None


def _world(args: argparse.Namespace, backend: str) -> int:
    if args.world is not None:
        return args.world
    if backend == "cuda":
        import torch

        return min(4, torch.cuda.device_count())
    return 4


BENCH_SIZES = {
    "cuda": ",".join([f"{1 << k}" for k in range(11, 28)] + ["3000", "100000", "3000000"]),
    "cpu": "1K,4K,16K,64K",
}


def _bench(args: argparse.Namespace) -> int:
    import json

    from .backendbench import backend_rank, format_backend, format_model, model_report
    from .bench import (
        bench_rank,
        format_bench,
        format_zero_copy,
        plot_bench,
        zero_copy_rank,
    )
    from .costs import format_cost, reliability_cost_rank
    from .detbench import deterministic_rank, format_deterministic
    from .microbench import format_micro, micro_rank
    from .moebench import format_moe, moe_rank
    from .report import write_json

    backend = detect_backend() if args.backend == "auto" else args.backend
    sizes = sorted({parse_size(s) for s in (args.sizes or BENCH_SIZES[backend]).split(",")})
    table = json.load(open(args.table))["table"] if args.table else None
    reports, all_reports, ok = [], [], True
    ops = args.op.split(",")
    if "model" in ops:  # fresh processes of its own, before the world's
        ops.remove("model")
        if backend != "cuda":
            print("bench --op model: GPUs only (the CPU world runs the tiny model in the tests)")
            ok = False
        else:
            rep = model_report(_world(args, backend))
            print(format_model(rep), flush=True)
            ok &= not rep["errors"] and rep["same_tokens"] and not rep.get("exit_stalls")
            if args.json and "{op}" in args.json:
                write_json(rep, args.json.replace("{op}", "model"))
            all_reports.append(rep)
    if ops and backend == "cpu":
        print(CPU_CAVEAT, flush=True)
    if ops:
        with LocalWorld(_world(args, backend), backend) as world:
            for op in ops:
                if op == "backend":
                    rep = world.run(backend_rank, sizes if args.sizes else None, timeout=1800)[0]
                    print(format_backend(rep), flush=True)
                    ok &= all(r["correct"] for r in rep["rows"])
                elif op == "moe":
                    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
                    shapes = args.shapes.split(",") if args.shapes else None
                    rep = world.run(moe_rank, shapes, tokens, timeout=3600)[0]
                    print(format_moe(rep), flush=True)
                    ok &= all(r["correct"] for r in rep["rows"])
                elif op == "primitives":
                    rep = world.run(micro_rank, timeout=1800)[0]
                    print(format_micro(rep), flush=True)
                elif op == "zerocopy":
                    rep = world.run(zero_copy_rank, sizes if args.sizes else None, timeout=1800)[0]
                    print(format_zero_copy(rep), flush=True)
                elif op == "deterministic":
                    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
                    rep = world.run(deterministic_rank, sizes if args.sizes else None, tokens, timeout=1800)[0]
                    print(format_deterministic(rep), flush=True)
                    ok &= all(r["correct"] for r in rep["rows"] + rep["norm_rows"])
                elif op == "costs":
                    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
                    rep = world.run(reliability_cost_rank, sizes if args.sizes else None, tokens, timeout=1800)[0]
                    print(format_cost(rep), flush=True)
                else:
                    rep = world.run(bench_rank, op, sizes, args.dtype, args.modes.split(","), table, timeout=3600)[0]
                    print(format_bench(rep), flush=True)
                    ok &= all(r["correct"] and r["identical"] for r in rep["rows"])
                    reports.append(rep)
                if backend == "cpu":
                    print(CPU_CAVEAT, flush=True)
                    rep["caveat"] = CPU_CAVEAT
                if args.json and "{op}" in args.json:
                    write_json(rep, args.json.replace("{op}", op))
                all_reports.append(rep)
    if args.json and "{op}" not in args.json:
        with open(args.json, "w") as f:
            json.dump({"reports": all_reports}, f, indent=1)
    if args.plot and reports:
        plot_bench(reports, args.plot)
    return 0 if ok else 1


def _layers(args: argparse.Namespace) -> int:
    import json

    from .layers import format_layers, layers_rank

    backend = detect_backend() if args.backend == "auto" else args.backend
    ok = True
    with LocalWorld(_world(args, backend), backend) as world:
        for part in args.parts.split(","):  # one part per job: a failure in one keeps the others' results
            rep = world.run(layers_rank, [part], timeout=3600)[0][part]
            print(format_layers(rep), flush=True)
            ok &= all(r["correct"] for r in rep["rows"])
            if args.json:
                with open(args.json.replace("{part}", part), "w") as f:
                    json.dump(rep, f, indent=1)
    return 0 if ok else 1


def _tune(args: argparse.Namespace) -> int:
    import json
    import os

    from ..collectives import SelectionTable
    from .tune import tune_rank

    backend = detect_backend() if args.backend == "auto" else args.backend
    ops = args.op.split(",")
    if "moe" in ops:
        ops.remove("moe")
        _tune_moe(args, backend)
        if not ops:
            return 0
    default = ",".join(str(1 << k) for k in range(11, 28)) if backend == "cuda" else "1K,16K,64K"
    sizes = sorted({parse_size(s) for s in (args.sizes or default).split(",")})
    rep = launch(tune_rank, _world(args, backend), ops, sizes, args.dtype, backend=backend, timeout=3600)[0]
    table = SelectionTable.from_json(rep["table"], "tune")
    for m in rep["measured"]:
        print(f"{m['op']:>13} {m['bytes']:>10} {m['best_us']:9.1f} us  {m['best']}")
    if args.out:
        if os.path.exists(args.out):
            old = json.load(open(args.out))
            table = SelectionTable.from_json(old["table"]).merged(table)
            tuned = {(m["op"], m["world"]) for m in rep["measured"]}
            rep["measured"] = [m for m in old.get("measured", []) if (m["op"], m.get("world")) not in tuned] + \
                rep["measured"]
            for key, value in old.items():  # keep what the old file records beside the table (e.g. "adopted")
                rep.setdefault(key, value)
        rep["table"] = table.to_json()
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"wrote {args.out}")
    return 0


def _tune_moe(args: argparse.Namespace, backend: str) -> None:
    """``tune --op moe``: print the measured rows and switches; with ``--out``, write them where the
    runtime reads them: the file's ``table`` (the format of ``collectives/tables/<device>.json``) gets,
    per world, the first tuned shape's ``throughput_from_tokens`` and ``prefill_from_tokens`` among
    the device table's other MoE switches, and its ``moe`` list keeps every shape's measured rows
    (replacing entries of the same world and shape)."""
    import json
    import os

    from ..collectives import SelectionTable
    from ..collectives.selection import read_table
    from .moetune import moe_tune_rank, table_switches

    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    shapes = args.shapes.split(",") if args.shapes else None
    rep = launch(moe_tune_rank, _world(args, backend), shapes, tokens, backend=backend, timeout=3600)[0]
    for r in rep["moe"]:
        print(f"moe {r['shape']} EP{r['world']}: prefill_from {r['prefill_from']}, "
              f"throughput_from {r['throughput_from']} ({rep['timing']})")
        for row in r["rows"]:
            print(f"  {row['tokens']:>6} tokens: decode shape {row['decode_us']:9.1f} us, prefill shape "
                  f"{row['prefill_us']:9.1f} us, throughput combine {row['throughput_us'] or float('nan'):9.1f} us")
    if args.out:
        old = json.load(open(args.out)) if os.path.exists(args.out) else {}
        fresh = {(r["world"], r["shape"]) for r in rep["moe"]}
        old["moe"] = [r for r in old.get("moe", []) if (r["world"], r["shape"]) not in fresh] + rep["moe"]
        base = SelectionTable.from_json(old["table"], args.out) if "table" in old else \
            read_table(backend, rep["device"])
        old["table"] = table_switches(rep, base).to_json()
        with open(args.out, "w") as f:
            json.dump(old, f, indent=1)
        print(f"wrote {args.out}")
