"""Where the overlapped GEMM + all-reduce spends its time beyond its GEMM (2+ GPUs).

The library kernel (``collectives/gemm_twoshot.py``) is rewritten textually into probes that keep
its work but drop one ingredient, loaded from a temporary file and launched in its place:

* ``local_partials``: partials stored into this rank's own heap instead of the owner's (no NVLink);
* ``local_finals``: reduced tiles stored into this rank's own heap instead of the peers';
* ``local_data``: both (every byte stays on the GPU; the flags still cross NVLink);
* ``no_sync``: both, and no signal or wait (the GEMM with the same stores, loads and copies).

The probes compute wrong sums (timing only). Against them: the kernel as shipped and its GEMM alone
(``local_gemm``). Run: ``PYTHONPATH=. python3 benchmarks/experiments/gemm_overlap_ablation.py`` on a
GPU machine (world = every GPU, at most 4; writes ``$OUT/gemm_ablation_tp{world}.json``). With
``CLOCK_LOG`` naming an ``nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv,
noheader,nounits -lms 50`` log written meanwhile, it adds GPU 0's mean SM clock and power per probe.
"""

# ruff: noqa: B023  (each closure is timed at once, inside the iteration that made it)

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from tritoncomm import CommConfig, Communicator
from tritoncomm.bench import _max_over_ranks
from tritoncomm.collectives import gemm_allreduce
from tritoncomm.collectives.gemm_allreduce import GemmAllReduce, GemmConfig
from tritoncomm.launch import LocalWorld
from tritoncomm.timing import time_per_call_us

SRC = pathlib.Path(gemm_allreduce.__file__).with_name("gemm_twoshot.py")
STUBS = '''

@triton.jit
def _no_signal(flags, value):
    pass


@triton.jit
def _no_wait(flags, expected, peers, slot, rank, timeout, diag):
    pass
'''
PARTIAL = "tl.store(heap_ptr(bases, owner, recv_off, DTYPE)"
FINAL = "tl.store(heap_ptr(bases, s, fin_off, DTYPE)"
PROBES = {
    "local_partials": [(PARTIAL, "tl.store(heap_ptr(bases, rank, recv_off, DTYPE)")],
    "local_finals": [(FINAL, "tl.store(heap_ptr(bases, rank, fin_off, DTYPE)")],
    "local_data": [(PARTIAL, "tl.store(heap_ptr(bases, rank, recv_off, DTYPE)"),
                   (FINAL, "tl.store(heap_ptr(bases, rank, fin_off, DTYPE)")],
    "no_sync": [(PARTIAL, "tl.store(heap_ptr(bases, rank, recv_off, DTYPE)"),
                (FINAL, "tl.store(heap_ptr(bases, rank, fin_off, DTYPE)"), ("        signal(", "        _no_signal("),
                ("                wait(", "                _no_wait(")],
}


def _probe_kernels(tmp: str):
    text = SRC.read_text().replace("from ..kernels import", "from tritoncomm.kernels import")
    kernels = {}
    for name, edits in PROBES.items():
        src = text + STUBS
        for old, new in edits:
            if old not in src:
                raise RuntimeError(f"probe {name}: {old!r} not found in {SRC}")
            src = src.replace(old, new)
        path = pathlib.Path(tmp) / f"probe_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"probe_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernels[name] = mod.gemm_twoshot_kernel
    return kernels


def job(ctx, ms, rounds, k=None, n=8192):
    cuda = ctx.backend == "cuda"
    comm = Communicator(ctx.cpu_group, config=CommConfig(heap_bytes=(3 << 30) if cuda else (64 << 20), timeout_s=60))
    k = k or 28672 // ctx.world
    op = GemmAllReduce(comm, max(ms), n, config=GemmConfig.for_backend(comm.backend))
    shipped = gemm_allreduce.gemm_twoshot_kernel
    rows = []
    windows = []  # (m, probe, start, end) wall clock of each timing, to match with clock/power samples
    with tempfile.TemporaryDirectory() as tmp:
        probes = _probe_kernels(tmp)
        g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
        w = (torch.randn(n, k, device=ctx.device, generator=g) / math.sqrt(k)).to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device=ctx.device, generator=g).to(torch.bfloat16)
            o = torch.empty(m, n, dtype=torch.bfloat16, device=ctx.device)
            ref = torch.matmul(x, w.t())
            dist.all_reduce(ref, group=ctx.group)
            got = op(x, w, path="overlap")
            ok = bool(((got.float() - ref.float()).abs().max() / ref.float().abs().max()) < 2e-2)

            def with_kernel(kernel):
                def run() -> None:  # captured with the probe's kernel, then the shipped one restored
                    gemm_allreduce.gemm_twoshot_kernel = kernel
                    try:
                        op(x, w, out=o, path="overlap")
                    finally:
                        gemm_allreduce.gemm_twoshot_kernel = shipped
                return run

            fns = {"shipped": lambda: op(x, w, out=o, path="overlap"), "gemm_alone": lambda: op.local_gemm(x, w, o),
                   **{name: with_kernel(kern) for name, kern in probes.items()}}
            samples = {name: [] for name in fns}
            for _ in range(rounds):
                for name, fn in fns.items():
                    t0 = time.time()
                    samples[name].append(time_per_call_us(fn, ctx.device, ctx.barrier, calls=4, replays=6))
                    windows.append((m, name, t0, time.time()))
            v = _max_over_ranks(ctx, {name: statistics.median(s) for name, s in samples.items()})
            rows.append({"m": m, "k": k, "n": n, "correct": ok, **{f"{q}_us": v[q] for q in fns}})
    op.close()
    comm.close()
    return (rows, windows) if ctx.rank == 0 else None


def _clocks(log: str, windows: list) -> dict:
    """Mean SM clock (MHz) and power (W) of GPU 0 over each probe's timing windows, from an
    ``nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv,noheader,nounits`` log."""
    import datetime

    samples = []
    for line in pathlib.Path(log).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or parts[1] != "0":
            continue
        ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((ts, float(parts[2]), float(parts[3])))
    out: dict = {}
    for m, name, t0, t1 in windows:
        got = [(c, p) for ts, c, p in samples if t0 <= ts <= t1]
        acc = out.setdefault(f"{m}:{name}", [])
        acc.extend(got)
    return {k: {"sm_mhz": statistics.mean(c for c, _ in v), "power_w": statistics.mean(p for _, p in v), "n": len(v)}
            for k, v in out.items() if v}


def main() -> None:
    world = min(4, torch.cuda.device_count())
    ms = [int(v) for v in os.environ.get("ABLATION_M", "2048,8192").split(",")]
    with LocalWorld(world, "cuda") as lw:
        rows, windows = lw.run(job, ms, 3, timeout=900)[0]
    out = os.environ.get("OUT", ".")
    log = os.environ.get("CLOCK_LOG")
    clocks = _clocks(log, windows) if log and os.path.exists(log) else {}
    with open(os.path.join(out, f"gemm_ablation_tp{world}.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "world": world, "rows": rows, "gpu0_clocks": clocks}, f,
                  indent=1)
    for key, c in clocks.items():
        print(f"GPU0 {key}: {c['sm_mhz']:.0f} MHz {c['power_w']:.0f} W ({c['n']} samples)")
    for r in rows:
        base = r["gemm_alone_us"]
        print(f"TP{world} M={r['m']} correct={r['correct']} " +
              " ".join(f"{q[:-3]}={r[q]:.1f}(+{r[q] - base:.0f})" for q in r if q.endswith("_us")))


if __name__ == "__main__":
    main()
