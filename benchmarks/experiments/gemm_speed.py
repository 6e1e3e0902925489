"""One GPU: the overlapped kernel's GEMM alone (COMM=False) vs cuBLAS, for the issue's shapes."""
import json, os
import torch, triton
from triton.tools.tensor_descriptor import TensorDescriptor
from tritoncomm.collectives.gemm_twoshot import gemm_twoshot_kernel

dev = torch.device("cuda", 0)
print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__, flush=True)
NSM = torch.cuda.get_device_properties(0).multi_processor_count
bases = torch.zeros(8, dtype=torch.int64, device=dev)

def launch(x, w, out, cfg):
    bm, bn, bk, gm, warps, stages, progs = cfg
    m, k = x.shape
    n = w.shape[0]
    gemm_twoshot_kernel[(progs,)](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        out, 0, m, n, k, bases, 0, 0, bases.data_ptr(), 0, 0, 0, 0, 0, WORLD=2, BM=bm, BN=bn, BK=bk, GROUP_M=gm, RB=16,
        OUT_REG=False, COMM=False, num_warps=warps, num_stages=stages)

def timeit(fn, reps=20):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(ts)[len(ts) // 2]

cfgs = [(128, 256, 64, 8, 8, 3, NSM), (128, 256, 64, 8, 8, 4, NSM), (128, 128, 64, 8, 8, 4, NSM),
        (128, 128, 64, 8, 4, 4, NSM), (256, 128, 64, 8, 8, 3, NSM), (128, 256, 64, 16, 8, 3, NSM),
        (64, 256, 64, 8, 4, 4, NSM)]
shapes = [(m, k, 8192) for k in (14336, 7168) for m in (512, 2048, 8192)]
rows = []
for (m, k, n) in shapes:
    g = torch.Generator(device=dev).manual_seed(m + k)
    x = torch.randn(m, k, device=dev, generator=g).bfloat16()
    w = (torch.randn(n, k, device=dev, generator=g) / k ** 0.5).bfloat16()
    ref = torch.matmul(x, w.t())
    o = torch.empty_like(ref)
    t_cublas = timeit(lambda: torch.matmul(x, w.t(), out=o), reps=10 if m == 8192 else 20)
    row = {"shape": [m, k, n], "cublas_us": t_cublas}
    for cfg in cfgs:
        try:
            o.fill_(float("nan"))
            launch(x, w, o, cfg)
            torch.cuda.synchronize()
            err = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = timeit(lambda: launch(x, w, o, cfg), reps=10 if m == 8192 else 20)
            row[str(cfg[:6])] = (round(t, 1), round(t / t_cublas, 3), err < 1e-2)
        except Exception as ex:  # noqa
            row[str(cfg[:6])] = repr(ex)[:200]
        print(m, k, cfg[:6], row[str(cfg[:6])], flush=True)
    rows.append(row)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "gemm_speed.json"), "w"), indent=1)
print("\nshape                cublas  best(cfg) ratio")
for r in rows:
    best = min((v for k2, v in r.items() if isinstance(v, tuple)), key=lambda v: v[0], default=None)
    bk = [k2 for k2, v in r.items() if v == best]
    print(r["shape"], round(r["cublas_us"], 1), best, bk)
