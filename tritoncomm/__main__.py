"""Command line: ``python -m tritoncomm demo [--world N] [--backend auto|cuda|cpu] ...``."""

from __future__ import annotations

import argparse
import sys

from .launch import detect_backend

DEFAULT_SIZES = {
    "cuda": "2K,8K,32K,128K,512K,1M,2M,8M,32M",
    "cpu": "1K,4K,16K,64K,256K",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritoncomm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="all-reduce correctness and timing table on local ranks")
    demo.add_argument("--world", type=int, default=None, help="ranks (default: 4, or the GPU count if fewer)")
    demo.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    demo.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    demo.add_argument("--sizes", default=None, help="comma-separated byte sizes, e.g. 2K,1M")
    demo.add_argument("--json", default=None, help="also write the report here")
    demo.add_argument("--no-timing", action="store_true", help="check correctness only")
    args = parser.parse_args(argv)

    from .demo import demo_rank, format_table, parse_size, write_json
    from .launch import launch

    backend = detect_backend() if args.backend == "auto" else args.backend
    world = args.world
    if world is None:
        world = 4
        if backend == "cuda":
            import torch

            world = min(4, torch.cuda.device_count())
    sizes = [parse_size(s) for s in (args.sizes or DEFAULT_SIZES[backend]).split(",")]
    print(f"starting {world} {backend} ranks ...", flush=True)
    report = launch(demo_rank, world, sizes, args.dtype, not args.no_timing, backend=backend, timeout=1800)[0]
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
    ok = all(r["correct"] and r["identical"] for r in report["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
