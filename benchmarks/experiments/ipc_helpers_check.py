"""Session 11 run 5 (one GPU, two processes; `PYTHONPATH=. python3 benchmarks/experiments/ipc_helpers_check.py`):
the shared CUDA IPC helpers after the review mend.
Process 0 exports a cudaMalloc block and the allocation under a torch tensor (as RegisteredBuffers
does, via cuMemGetAddressRange); process 1 opens both, reads them and writes back."""
import multiprocessing as mp

import torch


def child(q_in, q_out):
    from cuda.bindings import runtime as rt

    from tritoncomm.channels.cuda_ipc import ipc_open
    torch.cuda.set_device(0)
    raw_heap, raw_t, off, n = q_in.get()
    heap = ipc_open(raw_heap, "open heap")
    alloc = ipc_open(raw_t, "open tensor allocation")
    from tritoncomm.channels.cuda_ipc import _CudaBytes
    h = torch.as_tensor(_CudaBytes(heap, 16), device="cuda:0")
    t = torch.as_tensor(_CudaBytes(alloc + off, 4 * n), device="cuda:0").view(torch.float32)
    q_out.put((h.cpu().tolist(), float(t.sum())))
    t.mul_(2)
    torch.cuda.synchronize()
    rt.cudaIpcCloseMemHandle(heap)
    rt.cudaIpcCloseMemHandle(alloc)
    q_out.put("closed")


def main():
    from cuda.bindings import driver
    from cuda.bindings import runtime as rt

    from tritoncomm.channels.cuda_ipc import _CudaBytes, cuda_check, driver_check, ipc_export
    torch.cuda.set_device(0)
    blk = cuda_check(rt.cudaMalloc(1 << 20), "cudaMalloc")
    torch.as_tensor(_CudaBytes(int(blk), 16), device="cuda:0").copy_(torch.arange(16, dtype=torch.uint8))
    pad = torch.empty(1000, device="cuda")  # the tensor is not at its allocation's start
    x = torch.arange(4096, dtype=torch.float32, device="cuda") + 1
    base, _ = driver_check(driver.cuMemGetAddressRange(driver.CUdeviceptr(x.data_ptr())), "range")
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    qi, qo = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(qi, qo))
    p.start()
    qi.put((ipc_export(int(blk)), ipc_export(int(base)), x.data_ptr() - int(base), x.numel()))
    heap_bytes, s = qo.get(timeout=120)
    assert qo.get(timeout=120) == "closed"
    p.join(60)
    doubled = bool((x == 2 * (torch.arange(4096, device="cuda") + 1)).all())
    ok = heap_bytes == list(range(16)) and s == 4096 * 4097 / 2 and doubled
    print("doubled by the peer:", doubled, "offset in allocation", x.data_ptr() - int(base),
          "ipc check", "OK" if ok else "FAILED", heap_bytes[:4], s)
    del pad
    rt.cudaFree(blk)


if __name__ == "__main__":
    main()
