"""One GPU: the overlapped kernel's GEMM alone (``COMM=False``) against cuBLAS, for the issue's
Llama-70B down-projection shapes (K = 28672 / TP, N = 8192), over a few launch shapes.

Run on a GPU machine: ``PYTHONPATH=. python3 benchmarks/experiments/gemm_speed.py`` (writes
``$OUT/gemm_speed.json``). Session 12's result: ``results/raw/session12/run2-gemm-speed-1xh200.json``.
"""

# ruff: noqa: B023  (each closure is timed at once, inside the iteration that made it)

from __future__ import annotations

import json
import os

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from tritoncomm.collectives.gemm_twoshot import gemm_twoshot_kernel

DEV = torch.device("cuda", 0)
BASES = torch.zeros(8, dtype=torch.int64, device=DEV)


def launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: tuple[int, ...]) -> None:
    bm, bn, bk, gm, warps, stages, progs = cfg
    m, k = x.shape
    n = w.shape[0]
    gemm_twoshot_kernel[(progs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]), out, 0, m, n, k, BASES,
        0, 0, BASES.data_ptr(), 0, 0, 0, 0, 0, WORLD=2, BM=bm, BN=bn, BK=bk, GROUP_M=gm, RB=16, OUT_REG=False,
        COMM=False, num_warps=warps, num_stages=stages)


def timeit(fn, reps: int = 20) -> float:
    """Median of 5 replays of a graph of ``reps`` calls, µs per call."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__, flush=True)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs = [(128, 256, 64, 8, 8, 3, nsm), (128, 256, 64, 8, 8, 4, nsm), (128, 128, 64, 8, 8, 4, nsm),
            (128, 128, 64, 8, 4, 4, nsm), (256, 128, 64, 8, 8, 3, nsm), (128, 256, 64, 16, 8, 3, nsm),
            (64, 256, 64, 8, 4, 4, nsm)]
    rows = []
    for m, k, n in [(m, k, 8192) for k in (14336, 7168) for m in (512, 2048, 8192)]:
        g = torch.Generator(device=DEV).manual_seed(m + k)
        x = torch.randn(m, k, device=DEV, generator=g).bfloat16()
        w = (torch.randn(n, k, device=DEV, generator=g) / k ** 0.5).bfloat16()
        ref = torch.matmul(x, w.t())
        o = torch.empty_like(ref)
        reps = 10 if m == 8192 else 20
        row: dict = {"shape": [m, k, n], "cublas_us": timeit(lambda: torch.matmul(x, w.t(), out=o), reps)}
        for cfg in cfgs:
            o.fill_(float("nan"))
            launch(x, w, o, cfg)
            torch.cuda.synchronize()
            err = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = timeit(lambda cfg=cfg: launch(x, w, o, cfg), reps)
            row[str(cfg[:6])] = (round(t, 1), round(t / row["cublas_us"], 3), err < 1e-2)
            print(m, k, cfg[:6], row[str(cfg[:6])], flush=True)
        rows.append(row)
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gemm_speed.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
