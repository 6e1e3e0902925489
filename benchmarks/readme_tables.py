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


def _geo(ratios: list[float]) -> float:
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


def table(path: str) -> str:
    d = json.load(open(path))
    rows = [r for r in d["rows"] if r.get("dtype", "bf16") in ("bf16", "bfloat16")]
    reg = "tritoncomm_registered_us" in rows[0]  # session 11 on
    ratios = [r["nccl_us"] / r["tritoncomm_us"] for r in rows if r["bytes"] >= 8192]
    head = (f"**All-reduce, TP{d['world']}** — {d['device']}, {d['date']}, torch {d['torch']}, triton {d['triton']}; "
            "bf16, µs per call in CUDA graphs (32 calls captured, median of 20 replays, max over ranks). Geomean "
            f"speedup over NCCL for 8 KB-128 MB: {_geo(ratios):.2f}x (lowest {min(ratios):.2f}x)")
    if reg:
        rr = [r["nccl_us"] / r["tritoncomm_registered_us"] for r in rows if r["bytes"] >= 8192]
        head += f"; with registered outputs {_geo(rr):.2f}x (lowest {min(rr):.2f}x)"
    head += (f". Workspace {d['workspace_bytes'] / 2**20:.0f} MiB = {d['workspace_over_largest_message']:.2f}x the "
             'largest message. "symmetric": the same all-reduce on tensors from `comm.empty`, the setting torch '
             "symm_mem is timed in")
    head += ('; "registered": a regular input and a regular output registered with `comm.register` (what '
             "`comm.graph_capture` does for a graph's outputs); the last column compares it with the better "
             "symm_mem." if reg else "; the last column compares that one with the better symm_mem.")
    cols = ("bytes", "algorithm", "tritoncomm", *(("registered",) if reg else ()), "symmetric", "NCCL",
            "symm_mem 1-shot", "symm_mem 2-shot", "vs NCCL", *(("registered vs NCCL",) if reg else ()),
            "vs best symm_mem")
    out = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        heap, s1, s2 = r["tritoncomm_heap_us"], r["symm_one_shot_us"], r["symm_two_shot_us"]
        us, nccl = r["tritoncomm_us"], r["nccl_us"]
        mine = r["tritoncomm_registered_us"] if reg else heap
        size = format_bytes(r["bytes"], sep=" ", suffix="B")
        cells = [size, r["algo"], f"{us:.1f}", *([f"{mine:.1f}"] if reg else []), f"{heap:.1f}", f"{nccl:.1f}",
                 f"{s1:.1f}", f"{s2:.1f}", f"{nccl / us:.2f}x", *([f"{nccl / mine:.2f}x"] if reg else []),
                 f"{min(s1, s2) / mine:.2f}x"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _fused_table(path: str, title: str, cols: tuple[str, ...], ops: tuple[str, ...], cells) -> str:
    """A table of the rows of a ``fused-h200-tp*.json`` whose op is in ``ops``: ``cells(row)`` gives
    the row's cells after the first column's."""
    d = json.load(open(path))
    out = [f"**TP{d['world']}, {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(cells(r)) + " |" for r in d["rows"] if r["op"] in ops]
    return "\n".join(out)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _norm_cells(r: dict) -> list[str]:
    us, bare, base = r["tritoncomm_us"], r["bare_allreduce_us"], r["baseline_us"]
    return [str(r["shape"][0]), r["variant"], f"{us:.1f}", f"{bare:.1f}", f"{us / bare:.2f}", f"{base:.1f}",
            f"{base / us:.2f}x"]


def _gemm_cells(r: dict) -> list[str]:
    """Rows of session 12 on have the registered-output and Triton-GEMM-alone columns; older rows
    (the old pull-based overlap kernel) show "-" there."""
    us, base = r["tritoncomm_us"], r["baseline_us"]
    reg = r.get("tritoncomm_registered_us")
    return [str(r["shape"][0]), r["path"], f"{us:.1f}", _us(reg), f"{base:.1f}", f"{base / us:.2f}x",
            "-" if reg is None else f"{base / reg:.2f}x", _us(r["gemm_only_us"]), _us(r.get("triton_gemm_only_us")),
            _us(r["plain_us"]), _us(r.get("chunked2_p32_us")), _us(r["overlap_us"])]


def _decoder_cells(r: dict) -> list[str]:
    sh = r["shape"]
    step = f"decode, batch {sh['batch']}" if r["op"] == "decode_step" else "prefill"
    us, base = r["tritoncomm_us"], r["baseline_us"]
    return [step, str(sh["batch"] * sh["tokens"]), f"{us:.1f}", f"{base:.1f}", f"{r['tritoncomm_tok_s']:.0f}",
            f"{r['baseline_tok_s']:.0f}", f"{base / us:.2f}x"]


def fused_tables(path: str) -> str:
    """The fused-norm, GEMM + all-reduce and decoder tables of a ``fused-h200-tp*.json``."""
    return "\n\n".join([
        _fused_table(path, "all-reduce + residual + RMSNorm** (baseline: NCCL all-reduce + torch add + `F.rms_norm`)",
                     ("tokens", "variant", "fused", "our bare all-reduce", "fused / bare", "NCCL + torch", "speedup"),
                     ("allreduce_add_rmsnorm",), _norm_cells),
        _fused_table(path, "GEMM + all-reduce** (baseline: `torch.matmul` + NCCL all-reduce; tritoncomm: the path "
                     "the library selects, into a regular and into a registered output)",
                     ("M", "path", "tritoncomm", "registered out", "baseline", "speedup", "speedup (registered)",
                      "cuBLAS GEMM alone", "Triton GEMM alone", "plain", "chunked 2 (32 programs)", "overlap"),
                     ("gemm_allreduce",), _gemm_cells),
        _fused_table(path, "decoder** (baseline: the same layers with NCCL + torch add/RMSNorm for every reduction)",
                     ("step", "tokens", "tritoncomm µs", "NCCL µs", "tritoncomm tok/s", "NCCL tok/s", "speedup"),
                     ("decode_step", "prefill"), _decoder_cells)])


def tables(path: str) -> str:
    return fused_tables(path) if "fused" in path else table(path)


if __name__ == "__main__":
    print("\n\n".join(tables(p) for p in sys.argv[1:]))
