"""Write ``docs/performance.md`` and the README's headline tables from ``benchmarks/results/*.json``,
so that no published number is typed by hand.

    python benchmarks/render_docs.py            # rewrite both
    python benchmarks/render_docs.py --check    # exit 1 if either is out of date (a CI test runs this)

The README keeps its own text; only the region between ``<!-- headline tables: begin -->`` and
``<!-- headline tables: end -->`` is generated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PERF = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- headline tables: begin -->", "<!-- headline tables: end -->"
#: Sizes of the README's headline tables.
HEADLINE_BYTES = (8 << 10, 128 << 10, 1 << 20, 4 << 20, 16 << 20, 128 << 20)
#: The GPUs with results files (``{op}-{gpu}-tp{world}.json``), in the order their sections appear.
GPUS = ("h200", "h100")
#: The peers timed beside tritoncomm, as (row key, column title), where a results file has them.
PEERS = (("flashinfer_us", "FlashInfer TRT-LLM"), ("vllm_ca_us", "vLLM custom AR"), ("symm_mem_us", "torch symm_mem"),
         ("nccl_us", "NCCL"))


def size(n: int) -> str:
    for unit, s in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"


def us(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def load(name: str) -> dict[str, Any] | None:
    p = RESULTS / name
    return json.loads(p.read_text()) if p.exists() else None


def table(cols: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def on(gpu: str) -> str:
    """A section title's device suffix: none for the H200, the issues' reference GPU."""
    return "" if gpu == "h200" else f" ({gpu.upper()})"


def date_of(d: dict) -> str:
    return str(d["date"])[:10]


def caption(title: str, d: dict, extra: str = "") -> str:
    sw = ", ".join(f"{k} {d[k]}" for k in ("torch", "triton") if k in d)
    return f"**{title}** — {d['device']}, {date_of(d)}{', ' + sw if sw else ''}. {d.get('method', '')}{extra}"


def best_peer(r: dict) -> tuple[float | None, str]:
    """The fastest baseline of a row and its name."""
    have = [(r[k], name) for k, name in PEERS if r.get(k)]
    return min(have) if have else (None, "")


# -- all-reduce, all-gather, reduce-scatter ---------------------------------------------------------
def collective_table(d: dict, sizes: tuple[int, ...] | None = None) -> str:
    rows = [r for r in d["rows"] if r.get("dtype", "bf16") == "bf16" and (sizes is None or r["bytes"] in sizes)]
    reg = any(r.get("tritoncomm_registered_us") for r in rows)
    heap = any(r.get("tritoncomm_heap_us") for r in rows)
    peers = [(k, n) for k, n in PEERS if any(r.get(k) for r in rows)]
    cols = ["bytes", "algorithm", "tritoncomm", *(["registered out"] if reg else []),
            *(["symmetric"] if heap and sizes is None else []), *(n for _, n in peers), "vs NCCL", "vs best peer"]
    body = []
    for r in rows:
        mine = min(v for v in (r["tritoncomm_us"], r.get("tritoncomm_registered_us")) if v)
        peer, _ = best_peer(r)
        body.append([size(r["bytes"]), r["algo"], us(r["tritoncomm_us"]),
                     *([us(r.get("tritoncomm_registered_us"))] if reg else []),
                     *([us(r.get("tritoncomm_heap_us"))] if heap and sizes is None else []),
                     *(us(r.get(k)) for k, _ in peers), ratio(r["nccl_us"], mine), ratio(peer, mine)])
    return table(cols, body)


def collective_summary(d: dict) -> str:
    rows = [r for r in d["rows"] if r.get("dtype", "bf16") == "bf16" and r["bytes"] >= 8192]
    mine = [min(v for v in (r["tritoncomm_us"], r.get("tritoncomm_registered_us")) if v) for r in rows]
    vs_nccl = [r["nccl_us"] / m for r, m in zip(rows, mine, strict=True)]
    vs_best = [best_peer(r)[0] / m for r, m in zip(rows, mine, strict=True) if best_peer(r)[0]]
    text = (f"Geomean speedup over NCCL for {size(rows[0]['bytes'])}-{size(rows[-1]['bytes'])}: "
            f"{geomean(vs_nccl):.2f}x (lowest {min(vs_nccl):.2f}x)")
    if vs_best:
        text += f"; over the best peer of each size: {geomean(vs_best):.2f}x (lowest {min(vs_best):.2f}x)"
    ws = d.get("workspace_bytes")
    if ws:
        text += f". Workspace {ws / 2**20:.0f} MiB = {d['workspace_over_largest_message']:.2f}x the largest message"
    return text + "."


def headline(world: int) -> str | None:
    """The README's table for ``world``: the newest all-reduce results file of any GPU (the one measured
    with the algorithms the shipped table selects now, where an older one was not)."""
    found = [d for d in (load(f"allreduce-{gpu}-tp{world}.json") for gpu in GPUS) if d is not None]
    if not found:
        return None
    d = max(found, key=date_of)
    head = (f"**All-reduce, TP{world}** ({d['device']}, {date_of(d)}; bf16, µs per call in CUDA graphs, max over "
            f"ranks; tritoncomm's fastest form against each peer). {collective_summary(d)}")
    if not any(r.get("flashinfer_us") for r in d["rows"]):
        head += " FlashInfer's and vLLM's all-reduce (what engines run) were not timed in this run."
    return head + (" " + d["note"] if d.get("note") else "") + "\n\n" + collective_table(d, HEADLINE_BYTES)


# -- fused layers ------------------------------------------------------------------------------------
def norm_rows(d: dict) -> list[list[str]]:
    out = []
    for r in d["rows"]:
        if r["op"] != "allreduce_add_rmsnorm":
            continue
        f, bare, base = r["tritoncomm_us"], r["bare_allreduce_us"], r["baseline_us"]
        out.append([str(r["shape"][0]), r["variant"], us(f), us(r.get("tritoncomm_fp8_us")), us(bare),
                    f"{f / bare:.2f}", us(r.get("flashinfer_us")), us(r.get("flashinfer_fp8_us")), us(base),
                    ratio(base, f)])
    return out


def gemm_rows(d: dict) -> list[list[str]]:
    out = []
    for r in d["rows"]:
        if r["op"] != "gemm_allreduce":
            continue
        f, base, reg = r["tritoncomm_us"], r["baseline_us"], r.get("tritoncomm_registered_us")
        out.append([str(r["shape"][0]), r["path"], us(f), us(reg), us(base), ratio(base, f), ratio(base, reg),
                    us(r.get("gemm_only_us")), us(r.get("triton_gemm_only_us"))])
    return out


def decoder_rows(d: dict) -> list[list[str]]:
    out = []
    for r in d["rows"]:
        if r["op"] not in ("decode_step", "prefill"):
            continue
        sh = r["shape"]
        step = f"decode, batch {sh['batch']}" if r["op"] == "decode_step" else f"prefill {sh['tokens']} tokens"
        out.append([step, us(r["tritoncomm_us"]), us(r["baseline_us"]), us(r.get("flashinfer_us")),
                    ratio(r["baseline_us"], r["tritoncomm_us"]), ratio(r.get("flashinfer_us"), r["tritoncomm_us"])])
    return out


def fused_section(world: int, gpu: str = "h200") -> str:
    d = load(f"fused-{gpu}-tp{world}.json")
    if d is None:
        return ""
    parts = [f"### Fused layers, TP{world}{on(gpu)}", caption(f"TP{world}", d)]
    parts += ["All-reduce + residual + RMSNorm, hidden 8192 (baseline: NCCL all-reduce + torch add + "
              "`F.rms_norm`; bare: our all-reduce of the same bytes):",
              table(["tokens", "variant", "fused", "fused, FP8 out", "bare all-reduce", "fused / bare",
                     "FlashInfer fused", "FlashInfer, FP8 out", "NCCL + torch", "speedup"], norm_rows(d))]
    gemm, decoder = gemm_rows(d), decoder_rows(d)
    if gemm:
        parts += ["Row-parallel GEMM + all-reduce, K = 28672 / TP, N = 8192 (baseline: `torch.matmul` + NCCL; "
                  "tritoncomm: the path the library selects, into a regular and a registered output):",
                  table(["M", "path", "tritoncomm", "registered out", "baseline", "speedup", "speedup (registered)",
                         "cuBLAS GEMM alone", "Triton GEMM alone"], gemm)]
    if decoder:
        parts += ["Decoder, 4 Llama-70B-shaped layers (baseline: the same layers with NCCL and torch add/RMSNorm "
                  "for every reduction), µs per step:",
                  table(["step", "tritoncomm", "NCCL", "FlashInfer fused", "vs NCCL", "vs FlashInfer"], decoder)]
    if d.get("note"):  # what a reader must know beside the caption (a file's "notes" are for its raw runs)
        parts += [d["note"]]
    return "\n\n".join(parts)


# -- the rest ----------------------------------------------------------------------------------------
def backend_section(d: dict, gpu: str) -> str:
    host = "backend_eager_host_us" in d["rows"][0]
    cols = ["bytes", "graph: backend", "graph: direct", "graph: NCCL", "graph vs NCCL", "eager: backend",
            "eager: direct", "eager: NCCL", "eager vs NCCL"]
    rows = [[size(r["bytes"]), us(r["backend_graph_us"]), us(r["direct_graph_us"]), us(r["nccl_graph_us"]),
             ratio(r["nccl_graph_us"], r["backend_graph_us"]), us(r["backend_eager_us"]), us(r["direct_eager_us"]),
             us(r["nccl_eager_us"]), ratio(r["nccl_eager_us"], r["backend_eager_us"])] for r in d["rows"]]
    if host:  # the host's time to issue one eager call: where it matches the eager time, eager is host-bound
        cols += ["host to issue: backend", "direct", "NCCL"]
        for row, r in zip(rows, d["rows"], strict=True):
            row += [us(r["backend_eager_host_us"]), us(r["direct_eager_host_us"]), us(r["nccl_eager_host_us"])]
    return "\n\n".join([f"### torch.distributed backend, TP2{on(gpu)}",
                         caption("`dist.all_reduce` through a tritoncomm group vs the same `AllReduce` called "
                                 "directly", d), table(cols, rows)] + ([d["note"]] if d.get("note") else []))


def model_section(d: dict, gpu: str) -> str:
    c = d["config"]
    static_errors = "".join(f". {who} static cache + compile: {d[k]}" for who, k in
                            (("tritoncomm", "tritoncomm_static_error"), ("NCCL", "nccl_static_error")) if d.get(k))
    return "\n\n".join([
        f"### transformers' tensor parallelism with the backend, TP2{on(gpu)}",
        caption(f"Llama-shaped, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, random weights, "
                f"`tp_plan=\"auto\"`, {d['new_tokens']} greedy tokens", d, static_errors + "."),
        table(["backend", "ms per decode step (eager)", "same tokens as NCCL (eager)",
               "ms per decode step (static cache + compile)", "same tokens as NCCL (static)"],
              [["tritoncomm", f"{d['tritoncomm_eager_ms']:.2f}", str(d["same_tokens"]),
                us(d.get("tritoncomm_static_ms"), 2), str(d.get("same_static_tokens", "-"))],
               ["NCCL", f"{d['nccl_eager_ms']:.2f}", "-", us(d.get("nccl_static_ms"), 2), "-"]])])


def misc_section() -> str:
    parts = []
    d = load("hierarchical-h200-2x2.json")
    if d:
        parts += ["### Hierarchical all-reduce, 2 x 2", caption("2 \"nodes\" x 2 GPUs", d),
                  table(["bytes", "tritoncomm", "NCCL over 4 GPUs", "speedup"],
                        [[size(r["bytes"]), us(r["tritoncomm_us"]), us(r["baseline_us"]),
                          ratio(r["baseline_us"], r["tritoncomm_us"])] for r in d["rows"]])]
    d = load("primitives-h200.json")
    if d:
        parts += ["### Primitives, two GPUs", caption("put / get / copy engine", d),
                  f"Ping-pong round trip (signal, wait, signal back): {d['pingpong_round_trip_us']:.2f} µs.",
                  table(["bytes", "put µs", "put GB/s", "get µs", "get GB/s", "copy engine µs", "copy engine GB/s"],
                        [[size(r["bytes"]), us(r["put_us"]), us(r["put_GBps"]), us(r["get_us"]), us(r["get_GBps"]),
                          us(r["copy_engine_us"]), us(r["copy_engine_GBps"])] for r in d["bandwidth"]])]
    for w in (2, 4):
        d = load(f"reliability-cost-h200-tp{w}.json")
        if d:
            parts += [f"### What reliability costs, TP{w}", caption("bounded waits, the call check and debug mode", d)]
            checked = "check_cost_pct" in d["rows"][0]
            parts.append(table(["bytes", "algorithm", "bounded (graph)", "unbounded (graph)", "difference"]
                               + (["call check off (graph)", "call check cost"] if checked else [])
                               + ["eager", "debug (eager)", "debug cost"],
                               [[size(r["bytes"]), r.get("algo", ""), us(r["bounded_graph_us"]),
                                 us(r["unbounded_graph_us"]), f"{r['bounded_cost_pct']:+.1f}%"]
                                + ([us(r["unchecked_graph_us"]), f"{r['check_cost_pct']:+.1f}%"] if checked else [])
                                + [us(r["bounded_eager_us"]), us(r["debug_eager_us"]), us(r["debug_cost_us"])]
                                for r in d["rows"]]))
            if d.get("norm_rows"):
                parts += ["The fused add-RMSNorm with the call check on and off (graph):",
                          table(["tokens", "hidden", "variant", "check on", "check off", "cost"],
                                [[str(r["tokens"]), str(r["hidden"]), r["variant"], us(r["checked_us"]),
                                  us(r["unchecked_us"]), f"{r['check_cost_pct']:+.1f}%"] for r in d["norm_rows"]])]
            if d.get("moe_rows"):
                r0 = d["moe_rows"][0]
                parts += [f"MoE dispatch + combine (hidden {r0['hidden']}, {r0['experts']} experts, top-{r0['top_k']}) "
                          "with the call check on and off (graph):",
                          table(["tokens per rank", "dispatch path", "check on", "check off", "cost"],
                                [[str(r["tokens"]), r["path"], us(r["checked_us"]), us(r["unchecked_us"]),
                                  f"{r['check_cost_pct']:+.1f}%"] for r in d["moe_rows"]])]
    d = load("tritons-h200-tp2.json")
    if d:
        parts += ["### Triton 3.8 against 3.6, TP2", caption("the same benches on two Tritons", d),
                  table(["bytes", "algorithm (3.8)", "Triton 3.6", "Triton 3.8", "3.6 / 3.8", "best peer",
                         "3.8 / link floor"],
                        [[size(r["bytes"]), r["algo"], us(r["triton36_us"], 2), us(r["triton38_us"], 2),
                          f"{r['triton36_us'] / r['triton38_us']:.2f}", us(r["best_peer_us_38_run"], 2),
                          f"{r['triton38_us'] / r['link_floor_us']:.2f}"] for r in d["rows"]]),
                  "The fused add-RMSNorm, hidden 8192:",
                  table(["tokens", "variant (3.8)", "Triton 3.6", "Triton 3.8", "FP8 out, 3.6", "FP8 out, 3.8",
                         "FlashInfer", "FlashInfer, FP8 out"],
                        [[str(r["tokens"]), r["variant"], us(r["triton36_us"], 2), us(r["triton38_us"], 2),
                          us(r["triton36_fp8_us"], 2), us(r["triton38_fp8_us"], 2), us(r["flashinfer_us"], 2),
                          us(r["flashinfer_fp8_us"], 2)] for r in d["norm_rows"]])]
    d = load("deterministic-h200-tp2.json")
    if d:
        parts += ["### What the engines' deterministic modes run, TP2", caption("`bench --op deterministic`", d),
                  table(["bytes", "algorithm", "tritoncomm", "NCCL", "vs NCCL"],
                        [[size(r["bytes"]), r["algo"], us(r["tritoncomm_us"], 2), us(r["nccl_us"], 2),
                          ratio(r["nccl_us"], r["tritoncomm_us"])] for r in d["rows"]]),
                  "The fused add-RMSNorm (hidden 8192) as the normal mode runs it and with batch-invariant rows "
                  "(what the plugins serve in these modes), against the unfused path (all-reduce, add, "
                  "`F.rms_norm`) and, where measured, the engines' own deterministic path (the all-reduce, then "
                  "one add + RMSNorm kernel of one program per row: `fused_norm.local` standing in for the "
                  "engine's), after tritoncomm's all-reduce and after vLLM's custom all-reduce; the ratios are "
                  "the batch-invariant op's:",
                  table(["tokens", "variant", "fused", "batch-invariant", "unfused, tritoncomm all-reduce",
                         "unfused, NCCL", "engine path, tritoncomm all-reduce", "engine path, vLLM custom",
                         "vs unfused (NCCL)", "vs engine path (tritoncomm)", "vs engine path (vLLM custom)"],
                        [[str(r["tokens"]), r["variant"], us(r["fused_us"], 2), us(r.get("invariant_us"), 2),
                          us(r["unfused_tritoncomm_us"], 2), us(r["unfused_nccl_us"], 2),
                          us(r.get("engine_tritoncomm_us"), 2), us(r.get("engine_vllm_ca_us"), 2),
                          ratio(r["unfused_nccl_us"], r.get("invariant_us") or r["fused_us"]),
                          ratio(r.get("engine_tritoncomm_us"), r.get("invariant_us") or r["fused_us"]),
                          ratio(r.get("engine_vllm_ca_us"), r.get("invariant_us") or r["fused_us"])]
                         for r in d["norm_rows"]])]
    for w in (2, 4):
        d = load(f"zerocopy-h200-tp{w}.json")
        if d:
            parts += [f"### Symmetric tensors, TP{w}", caption("regular vs symmetric (`comm.empty`) tensors", d),
                      table(["bytes", "algorithm", "regular", "symmetric in and out", "symmetric out", "NCCL",
                             "same bits"],
                            [[size(r["bytes"]), r["algo"], us(r["staged_us"]), us(r["heap_us"]),
                              us(r.get("heap_out_us")), us(r["nccl_us"]), str(r["same_bits"])] for r in d["rows"]])]
    for gpu in GPUS:
        d = load(f"backend-{gpu}-tp2.json")
        if d:
            parts += [backend_section(d, gpu)]
    for gpu in GPUS:
        d = load(f"model-{gpu}-tp2.json")
        if d and not d.get("errors"):
            parts += [model_section(d, gpu)]
    return "\n\n".join(parts)


def performance() -> str:
    parts = ["# Performance",
             "Generated by `benchmarks/render_docs.py` from `benchmarks/results/*.json`; do not edit by hand. "
             "Every table was measured in one run per file, with its baselines in the same run, on the device "
             "and date in its caption. How each number is measured: `tritoncomm/tools/timing.py` (per call "
             "inside CUDA graphs: 32 calls captured, median of the replays, max over ranks). Why the algorithms "
             "and thresholds are what they are: `docs/algorithms.md`. The journal of predictions and outcomes: "
             "`benchmarks/NOTES.md`."]
    for op, title in (("allreduce", "All-reduce"), ("allgather", "All-gather"), ("reducescatter", "Reduce-scatter")):
        for w, gpu in ((w, gpu) for w in (2, 4, 8) for gpu in GPUS):
            d = load(f"{op}-{gpu}-tp{w}.json")
            if d is None:
                continue
            extra = ""
            if op == "allreduce":
                extra = (" \"registered out\": a regular input and a registered regular output (what "
                         "`comm.graph_capture` does for a graph's outputs); \"symmetric\": input and output from "
                         "`comm.empty`, the setting torch symm_mem is timed in.")
            parts += [f"## {title}, TP{w}{on(gpu)}",
                      caption(f"{title}, TP{w}", d, extra), collective_summary(d), collective_table(d)]
            if d.get("note"):
                parts += [d["note"]]
    parts += ["## Fused tensor-parallel layers"]
    parts += [s for s in (fused_section(w, gpu) for w in (2, 4, 8) for gpu in GPUS) if s]
    parts += ["## Other measurements", misc_section()]
    return "\n\n".join(parts).rstrip() + "\n"


def readme(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} region")
    # TP2 and TP4, whose runs time the peers engines run; TP8 and every other table: docs/performance.md
    tables = [t for t in (headline(w) for w in (2, 4)) if t]
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n\n".join(tables) + "\n" + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = ap.parse_args()
    want = {PERF: performance(), README: readme(README.read_text())}
    stale = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python benchmarks/render_docs.py")
        return 1 if stale else 0
    PERF.parent.mkdir(exist_ok=True)
    for p, text in want.items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
