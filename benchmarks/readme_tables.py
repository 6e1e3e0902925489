"""Print the README's all-reduce and fused-norm tables from the committed results (no transcription
by hand):

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


if __name__ == "__main__":
    print("\n\n".join(norm_table(p) if "fused" in p else table(p) for p in sys.argv[1:]))
