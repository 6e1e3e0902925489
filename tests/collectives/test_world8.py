"""World size 8 (one full node): every algorithm, all-gather, reduce-scatter and all-to-all, in the CPU world in
CI and on 8 GPUs with ``TRITONCOMM_TEST_BACKEND=cuda`` (the nvidia-h200-x8 machine; see the README)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import tritoncomm as tc
from tritoncomm.collectives import load_table
from tritoncomm.tools.tune import candidates

from ..helpers import check_close, make_comm, reference_sum, same_on_all_ranks


def _job_world8(ctx):
    comm = make_comm(ctx, timeout_s=120)
    ar = tc.AllReduce(comm, max_bytes=1 << 16, algos=tuple(tc.collectives.ALGORITHMS))
    ag = tc.AllGather(comm, max_bytes=1 << 16)
    rs = tc.ReduceScatter(comm, max_bytes=1 << 16)
    bad = []
    for algo in tc.collectives.ALGORITHMS:
        for n in (5, 3001):
            x = torch.randn(n, generator=torch.Generator().manual_seed(n + ctx.rank)).to(torch.bfloat16).to(ctx.device)
            out = ar(x, algo=algo)
            try:
                check_close(out, reference_sum(ctx, x), torch.bfloat16)
            except AssertionError as e:
                bad.append((algo, n, str(e)))
            if not same_on_all_ranks(ctx, out):
                bad.append((algo, n, "ranks differ"))
    x = torch.randn(1000, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    full = ag(x)
    if not torch.equal(full[ctx.rank * 1000:(ctx.rank + 1) * 1000], x) or not same_on_all_ranks(ctx, full):
        bad.append(("allgather",))
    big = torch.randn(8 * 500, generator=torch.Generator().manual_seed(7 + ctx.rank)).to(ctx.device)
    part = rs(big)
    check_close(part, reference_sum(ctx, big)[ctx.rank * 500:(ctx.rank + 1) * 500], torch.float32)
    a2a = tc.AllToAll(comm, max_bytes=1 << 16)
    swapped, want = a2a(big).cpu(), torch.empty_like(big.cpu())
    dist.all_to_all_single(want, big.cpu(), group=ctx.cpu_group)
    if not torch.equal(swapped, want):
        bad.append(("alltoall",))
    for obj in (ar, ag, rs, a2a, comm):
        obj.close()
    return bad


def test_world8_every_algorithm(worlds):
    for bad in worlds(8).run(_job_world8, timeout=1500):
        assert bad == []


def test_tuning_logic_is_ready_for_8():
    """The shipped H200 table has rows tuned at world 8 (measured on 8 H200s) for every op and dtype;
    world sizes without tuned rows (5-7) fall back to the rules of thumb."""
    table = load_table("cuda", "NVIDIA H200")
    for op in ("allreduce", "allgather", "reducescatter"):
        for dtype in ("bf16", "fp16", "fp32"):
            assert (op, 8, dtype) in table.rows and "nvidia-h200" in table.source
    for nbytes in (2048, 1 << 20, 1 << 27):
        assert table.lookup("allreduce", 8, "bf16", nbytes).algo in tc.collectives.ALGORITHMS
        assert table.lookup("allreduce", 6, "bf16", nbytes) == load_table("cuda").lookup("allreduce", 6, "bf16", nbytes)
        assert candidates("allreduce", nbytes, "cuda")


def test_tuned_and_candidate_barrier_grids_stay_under_the_warp_cap():
    """Shapes past MAX_BARRIER_WARPS or MAX_BARRIER_PROGRAMS are not shown free of the rare 10-30x
    slow timings (tune.py): neither the tuning candidates nor the shipped table may use them for
    kernels with cross-rank barriers."""
    from tritoncomm.tools.tune import COLLECTIVES, MAX_BARRIER_PROGRAMS, MAX_BARRIER_WARPS

    def ok(c) -> bool:
        no_barrier = not COLLECTIVES[op].ALGORITHMS[c.algo].barriers
        return no_barrier or (c.programs * c.num_warps <= MAX_BARRIER_WARPS and c.programs <= MAX_BARRIER_PROGRAMS)

    for op in ("allreduce", "allgather", "reducescatter"):
        for k in range(11, 28):
            for c in candidates(op, 1 << k, "cuda"):
                assert ok(c), (op, k, c)
    table = load_table("cuda", "NVIDIA H200")
    for op in ("allreduce", "allgather", "reducescatter"):
        for w in (2, 4, 8):
            for k in range(11, 28):
                c = table.lookup(op, w, "bf16", 1 << k)
                assert ok(c), (op, w, k, c)
