"""Print the README's all-reduce, fused-norm, GEMM + all-reduce and decoder tables from the committed
results (no transcription by hand):

    python benchmarks/readme_tables.py benchmarks/results/allreduce-h200-tp{2,4}.json
    python benchmarks/readme_tables.py benchmarks/results/fused-h200-tp{2,4}.json
"""

from __future__ import annotations

import json
import math
import sys

from tritoncomm.units import format_bytes


def table(path: str) -> str:
    d = json.load(open(path))
    rows = [r for r in d["rows"] if r.get("dtype", "bf16") in ("bf16", "bfloat16")]
    ratios = [r["nccl_us"] / r["tritoncomm_us"] for r in rows if r["bytes"] >= 8192]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    head = (f"**All-reduce, TP{d['world']}** — {d['device']}, {d['date']}, torch {d['torch']}, triton {d['triton']}; "
            "bf16, µs per call in CUDA graphs (32 calls captured, median of 20 replays, max over ranks). Geomean "
            f"speedup over NCCL for 8 KB-128 MB: {geo:.2f}x (lowest {min(ratios):.2f}x). Workspace "
            f"{d['workspace_bytes'] / 2**20:.0f} MiB = {d['workspace_over_largest_message']:.2f}x the largest message. "
            '"symmetric": the same all-reduce on tensors from `comm.empty`, the setting torch symm_mem is timed in; '
            "the last column compares that one with the better symm_mem.")
    cols = ("bytes", "algorithm", "tritoncomm", "symmetric", "NCCL", "symm_mem 1-shot", "symm_mem 2-shot", "vs NCCL",
            "vs best symm_mem")
    out = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        heap, s1, s2 = r["tritoncomm_heap_us"], r["symm_one_shot_us"], r["symm_two_shot_us"]
        us, nccl = r["tritoncomm_us"], r["nccl_us"]
        size = format_bytes(r["bytes"], sep=" ", suffix="B")
        out.append(f"| {size} | {r['algo']} | {us:.1f} | {heap:.1f} | {nccl:.1f} | {s1:.1f} | {s2:.1f} | "
                   f"{nccl / us:.2f}x | {min(s1, s2) / heap:.2f}x |")
    return "\n".join(out)


def norm_table(path: str) -> str:
    """The all-reduce + residual + RMSNorm rows of a ``fused-h200-tp*.json``."""
    d = json.load(open(path))
    out = [f"**TP{d['world']}, all-reduce + residual + RMSNorm** (baseline: NCCL all-reduce + torch add + "
           "`F.rms_norm`)", "",
           "| tokens | variant | fused | our bare all-reduce | fused / bare | NCCL + torch | speedup |",
           "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if r["op"] == "allreduce_add_rmsnorm":
            us, bare, base = r["tritoncomm_us"], r["bare_allreduce_us"], r["baseline_us"]
            out.append(f"| {r['shape'][0]} | {r['variant']} | {us:.1f} | {bare:.1f} | {us / bare:.2f} | {base:.1f} | "
                       f"{base / us:.2f}x |")
    return "\n".join(out)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def gemm_table(path: str) -> str:
    """The GEMM + all-reduce rows of a ``fused-h200-tp*.json``."""
    d = json.load(open(path))
    out = [f"**TP{d['world']}, GEMM + all-reduce** (baseline: `torch.matmul` + NCCL all-reduce; tritoncomm: the "
           "path the library selects)", "",
           "| M | path | tritoncomm | baseline | speedup | GEMM alone | plain | chunked 2 (uncapped) | "
           "chunked 2, cuBLASLt carve-out 32 | overlap kernel |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if r["op"] == "gemm_allreduce":
            us, base = r["tritoncomm_us"], r["baseline_us"]
            out.append(f"| {r['shape'][0]} | {r['path']} | {us:.1f} | {base:.1f} | {base / us:.2f}x | "
                       f"{r['gemm_only_us']:.1f} | {r['plain_us']:.1f} | {_us(r.get('chunked2_us'))} | "
                       f"{_us(r.get('chunked2_p32_cv32_us'))} | {r['overlap_us']:.1f} |")
    return "\n".join(out)


def decoder_table(path: str) -> str:
    """The decoder rows (decode steps, prefill) of a ``fused-h200-tp*.json``."""
    d = json.load(open(path))
    out = [f"**TP{d['world']}, decoder** (baseline: the same layers with NCCL + torch add/RMSNorm for every "
           "reduction)", "",
           "| step | tokens | tritoncomm µs | NCCL µs | tritoncomm tok/s | NCCL tok/s | speedup |",
           "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if r["op"] in ("decode_step", "prefill"):
            sh = r["shape"]
            step = f"decode, batch {sh['batch']}" if r["op"] == "decode_step" else "prefill"
            out.append(f"| {step} | {sh['batch'] * sh['tokens']} | {r['tritoncomm_us']:.1f} | {r['baseline_us']:.1f} | "
                       f"{r['tritoncomm_tok_s']:.0f} | {r['baseline_tok_s']:.0f} | "
                       f"{r['baseline_us'] / r['tritoncomm_us']:.2f}x |")
    return "\n".join(out)


def tables(path: str) -> str:
    if "fused" not in path:
        return table(path)
    return "\n\n".join(f(path) for f in (norm_table, gemm_table, decoder_table))


if __name__ == "__main__":
    print("\n\n".join(tables(p) for p in sys.argv[1:]))
