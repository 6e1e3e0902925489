"""A collective of your own: broadcast, in about 40 lines, with tritoncomm's public primitives only.

Run it: ``python examples/custom_collective.py --world 3`` (GPUs when present, else the CPU world).
The README's "Writing your own collective" section walks through it.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import tritoncomm as tc
from tritoncomm.kernels import Launcher, barrier, epoch_commit, epoch_next, get, heap_ptr, put


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def broadcast_kernel(x, out, n, root, bases, rank, world, timeout, diag_addr, flags_off, epochs_off, buf_off,
                     BLOCK: tl.constexpr):
    DT: tl.constexpr = x.dtype.element_ty
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)  # this launch's epoch lives in device memory
    e = epoch_next(ep)
    if rank == root:  # 1. the root writes its data into every peer's buffer (and its own output)
        for p in range(0, world):
            if p != root:
                put(heap_ptr(bases, p, buf_off, DT), x, n, BLOCK)
        put(out, x, n, BLOCK)
    barrier(bases, rank, world, flags_off, 0, e, timeout, diag)  # 2. release/acquire: the data is there
    if rank != root:  # 3. everyone else copies it out of its own heap
        get(out, heap_ptr(bases, rank, buf_off, DT), n, BLOCK)
    barrier(bases, rank, world, flags_off, 1, e, timeout, diag)  # 4. buffers free for the next launch
    epoch_commit(ep, e)


class Broadcast:
    """``out = x of rank root`` on every rank. Set up once (collective), call many times."""

    def __init__(self, comm: tc.Communicator, max_bytes: int) -> None:
        self.comm = comm
        self.max_bytes = max_bytes
        self.channel = tc.Channel(comm, "broadcast", programs=1, barrier_slots=2, buffer_bytes=max_bytes)
        self.kernel = Launcher(broadcast_kernel, (1,))  # broadcast_kernel[(1,)] with less host time per call

    def __call__(self, x: torch.Tensor, root: int = 0) -> torch.Tensor:
        if not x.is_contiguous() or x.numel() * x.element_size() > self.max_bytes or x.device != self.comm.device:
            raise tc.InvalidInputError("broadcast: need a contiguous tensor on this device within max_bytes")
        out = torch.empty_like(x)
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        self.kernel(x, out, x.numel(), root, bases, rank, world, timeout, diag, ch.flags_off, ch.epochs_off,
                    ch.buffer_off, BLOCK=1024)
        return out

    def close(self) -> None:
        self.channel.close()


def demo(ctx, n: int = 5000) -> bool:
    """Runs in every rank: broadcast from each root in turn, compared with torch.distributed."""
    import torch.distributed as dist

    comm = tc.Communicator(ctx.cpu_group)
    bcast = Broadcast(comm, max_bytes=4 * n)
    ok = True
    for root in range(ctx.world):
        x = torch.randn(n, generator=torch.Generator().manual_seed(root * 100 + ctx.rank)).to(ctx.device)
        out = bcast(x, root)
        comm.synchronize()
        ref = x.cpu().clone()
        dist.broadcast(ref, src=root, group=ctx.cpu_group)
        ok &= torch.equal(out.cpu(), ref)
    bcast.close()
    comm.close()
    return ok


if __name__ == "__main__":
    from tritoncomm.launch import launch

    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=3)
    args = parser.parse_args()
    print("broadcast matches torch.distributed on every rank:", all(launch(demo, args.world)))
