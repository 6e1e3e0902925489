"""A barrier-free collective of your own: all-gather through Lamport buffers, with tritoncomm's
public primitives only (for example the vocab-parallel logits every decode step gathers).

Run it: ``python examples/lamport_allgather.py --world 3`` (GPUs when present, else the CPU world).

A Lamport buffer's data is its own flag: at rest every element holds a sentinel that no stored value
carries (``lamport_store`` sends -0.0 as +0.0), so a reader polls the values themselves and needs no
flag, fence or barrier. Each rank stores its shard into slot [parity][its rank] of every rank's
buffer, polls the W slots of its own buffer, copies them out and resets them to the sentinel.

Why two parities are enough: a rank finishes launch k only after it has every peer's shard of launch
k, so no peer can be more than one launch ahead. A peer storing into parity k % 2 again (launch k + 2)
has finished launch k + 1, which needed this rank's shard of launch k + 1, stored after this rank's
launch k (and its resets) ended on its stream.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import tritoncomm as tc
from tritoncomm.kernels import (
    Launcher,
    epoch_commit,
    heap_ptr,
    lamport_poll,
    lamport_reset,
    lamport_store,
    program_epoch,
)
from tritoncomm.units import round_up


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def lamport_allgather_kernel(x, out, n, bases, rank, world, timeout, diag_addr, epochs_off, buf_off, slot_elems,
                             BLOCK: tl.constexpr):
    DT: tl.constexpr = x.dtype.element_ty
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep, e = program_epoch(bases, rank, epochs_off)  # this program's launch count, kept in device memory
    parity = (e & 1).to(tl.int64)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m)
        for p in range(0, world):  # 1. my block into slot [parity][my rank] of every rank's buffer
            slot = heap_ptr(bases, p, buf_off, DT) + (parity * world + rank) * slot_elems
            lamport_store(slot + offs, v, m)
        mine = heap_ptr(bases, rank, buf_off, DT) + parity * world * slot_elems
        for s in range(0, world):  # 2. rank s's block: wait until none of it is the sentinel (bounded)
            got = lamport_poll(mine + s * slot_elems + offs, m, s, s, rank, timeout, diag)
            tl.store(out + s * n + offs, got, mask=m)
            lamport_reset(mine + s * slot_elems + offs, m)  # 3. at rest again for launch e + 2
    epoch_commit(ep, e)


class LamportAllGather:
    """``out[s * n:(s + 1) * n] = x of rank s`` for inputs of up to ``max_elems`` elements of 16 or 32
    bits, bit for bit except that 16-bit -0.0 arrives as +0.0. Set up once (collective), call many
    times; one per stream."""

    def __init__(self, comm: tc.Communicator, max_elems: int, programs: int = 4, block: int = 1024) -> None:
        self.comm, self.max_elems, self.block = comm, max_elems, block
        self.slot_bytes = round_up(4 * max_elems, 256)  # room for fp32; 256-byte aligned slots
        both = 2 * comm.world * self.slot_bytes  # two parities of W slots, all starting at rest
        self.channel = tc.Channel(comm, "lamport_allgather", programs=programs, buffer_bytes=both,
                                  lamport_bytes=both)
        self.kernel = Launcher(lamport_allgather_kernel, (programs,))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.is_contiguous() and x.device == self.comm.device and 0 < x.numel() <= self.max_elems
                and x.element_size() in (2, 4)):
            raise tc.InvalidInputError("lamport all-gather: need a contiguous 16- or 32-bit tensor on this device "
                                       f"with 1 to {self.max_elems} elements")
        out = torch.empty(self.comm.world * x.numel(), dtype=x.dtype, device=x.device)
        bases, rank, world, timeout, diag = self.comm.kernel_args()
        ch = self.channel
        self.kernel(x, out, x.numel(), bases, rank, world, timeout, diag, ch.epochs_off, ch.buffer_off,
                    self.slot_bytes // x.element_size(), BLOCK=self.block)
        return out

    def close(self) -> None:
        self.channel.close()


def demo(ctx, max_elems: int = 5000) -> bool:
    """Runs in every rank: sizes and dtypes that change from call to call (the buffers must be back at
    rest after each), compared bit for bit with torch.distributed's all-gather (16-bit -0.0 as +0.0)."""
    import torch.distributed as dist

    comm = tc.Communicator(ctx.cpu_group)
    gather = LamportAllGather(comm, max_elems)
    gen = torch.Generator().manual_seed(ctx.rank)
    ok = True
    calls = [(max_elems, torch.bfloat16), (1, torch.float32), (max_elems // 3 + 1, torch.float16),
             (max_elems - 1, torch.float32), (3, torch.bfloat16), (max_elems, torch.bfloat16)]
    for i, (n, dtype) in enumerate(calls):
        x = torch.randn(n, generator=gen).to(dtype)
        x[i % n] = -0.0
        out = gather(x.to(ctx.device))
        comm.synchronize()
        parts = [torch.empty_like(x) for _ in range(ctx.world)]
        dist.all_gather(parts, x, group=ctx.cpu_group)
        want = torch.cat(parts)
        if dtype.itemsize == 2:
            want[want == 0] = 0.0
        ok &= torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8))
    gather.close()
    comm.close()
    return ok


if __name__ == "__main__":
    from tritoncomm.launch import launch

    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=3)
    args = parser.parse_args()
    print("Lamport all-gather matches torch.distributed on every rank:", all(launch(demo, args.world)))
