"""tritoncomm under torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    torchrun --nproc-per-node 4 examples/torchrun_allreduce.py                       # GPUs
    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 examples/torchrun_allreduce.py    # CPU world
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import tritoncomm as tc
from tritoncomm.launch import init_from_env


def main() -> None:
    ctx = init_from_env()
    comm = tc.Communicator(ctx.cpu_group)
    ar = tc.AllReduce(comm, max_bytes=1 << 20, fallback_group=ctx.group)
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    out = ar(x)
    comm.synchronize()
    ref = x.clone()
    dist.all_reduce(ref, group=ctx.group)
    ok = torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    print(f"rank {ctx.rank}/{ctx.world} ({ctx.backend}): all-reduce {'matches' if ok else 'DIFFERS FROM'} "
          "torch.distributed", flush=True)
    ar.close()
    comm.close()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
