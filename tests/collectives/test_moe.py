"""MoE dispatch and combine against a reference built from every rank's tokens and routing (gathered
over gloo): random routing with edge cases, token counts that differ per rank (zero included),
exact expert layouts and counts, combine bits, bad input."""

from __future__ import annotations

import pytest
import torch

from tritoncomm.collectives.moe import MoEAllToAll
from tritoncomm.errors import InvalidInputError

from ..helpers import make_comm, world_sizes
from ..integrations.enginetest import gathered


def _routing(g: torch.Generator, n: int, experts: int, k: int, local: int, case: str) -> torch.Tensor:
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(n)]) if n else \
        torch.empty(0, k, dtype=torch.int64)
    if case == "one-rank" and n:  # every expert of token 0 on rank 0
        ids[0] = torch.arange(k) % local
    if case == "hot" and n:  # expert 1 chosen by every token
        others = torch.tensor([x for x in range(experts) if x != 1])
        ids = torch.stack([torch.cat([torch.tensor([1]), others[torch.randperm(len(others), generator=g)[:k - 1]]])
                           for _ in range(n)])
    return ids


def _job(ctx, experts: int, k: int, hidden: int, max_tokens: int, case: str, reps: int):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    w, r = ctx.world, ctx.rank
    local = experts // w
    moe = MoEAllToAll(comm, max_tokens=max_tokens, hidden=hidden, num_experts=experts, top_k=k)
    bad = []
    for rep in range(reps):
        g = torch.Generator().manual_seed(1000 * rep + 17 * r + 3)
        n = int(torch.randint(0, max_tokens + 1, (1,), generator=g))
        if rep == 0 and r == w - 1:
            n = 0  # a rank with no tokens
        x = torch.randn(n, hidden, generator=g).to(torch.bfloat16)
        ids = _routing(g, n, experts, k, local, case)
        wts = torch.rand(n, k, generator=g)
        dev = ctx.device
        out, counts, handle = moe.dispatch(x.to(dev), ids.to(dev), wts.to(dev))
        # reference: every rank's tokens and ids, padded to max_tokens
        xs = gathered(ctx, torch.cat([x, torch.zeros(max_tokens - n, hidden, dtype=x.dtype)]))
        idl = gathered(ctx, torch.cat([ids, torch.full((max_tokens - n, k), -1, dtype=ids.dtype)]))
        for el in range(local):
            e = r * local + el
            rows = [xs[s][t] for s in range(w) for t in range(max_tokens) for j in range(k) if idl[s][t, j] == e]
            c = int(counts[el])
            if c != len(rows):
                bad.append((rep, "count", e, c, len(rows)))
            elif rows and not torch.equal(out[el, :c].cpu(), torch.stack(rows)):
                bad.append((rep, "rows", e))
        # experts: y = x * (e + 1), rounded
        scale = (torch.arange(local) + r * local + 1).float().to(dev)
        y = (out.float() * scale[:, None, None]).to(torch.bfloat16)
        comb = moe.combine(y, handle).cpu()
        want = torch.zeros(n, hidden)
        for t in range(n):
            acc = torch.zeros(hidden)
            for j in range(k):
                acc = acc + wts[t, j] * (x[t].float() * float(ids[t, j] + 1)).to(torch.bfloat16).float()
            want[t] = acc
        if not torch.equal(comb, want.to(torch.bfloat16)):
            bad.append((rep, "combine", (comb.float() - want).abs().max().item() if n else None))
    moe.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world", world_sizes(2, 3, 4))
@pytest.mark.parametrize("case", ["random", "one-rank", "hot"])
def test_dispatch_combine_match_reference(worlds, world, case):
    experts = 2 * world if case != "hot" else 4 * world
    for bad in worlds(world).run(_job, experts, 3, 40, 6, case, 3):
        assert bad == []


def _bad_input(ctx):
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2)
    dev, errs = ctx.device, []
    x = torch.zeros(3, 16, dtype=torch.bfloat16, device=dev)
    ids = torch.zeros(3, 2, dtype=torch.int64, device=dev)
    wts = torch.ones(3, 2, device=dev)
    for args in ((torch.zeros(5, 16, dtype=torch.bfloat16, device=dev), torch.zeros(5, 2, dtype=torch.int64,
                                                                                     device=dev), torch.ones(5, 2)),
                 (x.float(), ids, wts), (x, ids[:, :1], wts), (x, ids.float(), wts)):
        try:
            moe.dispatch(*args)
            errs.append("no error")
        except InvalidInputError as e:
            errs.append(type(e).__name__)
    ids_bad = ids.clone()
    ids_bad[1, 0] = 99  # out of range: dropped now, reported at the next call
    out, _, h = moe.dispatch(x, ids_bad, wts)
    moe.combine(out, h)
    try:
        moe.dispatch(x, ids, wts)
        errs.append("no error")
    except InvalidInputError as e:
        errs.append("ids: " + ("outside" in str(e)) * "reported")
    _, _, h = moe.dispatch(x, ids, wts)  # the error was reported once; calls go on
    try:
        moe.combine(out, h)
        moe.combine(out, h)
        errs.append("no error")
    except InvalidInputError:
        errs.append("reused handle")
    moe.close()
    comm.close()
    return errs


def test_bad_input_raises_before_waiting(worlds):
    for errs in worlds(2).run(_bad_input):
        assert errs == ["InvalidInputError"] * 4 + ["ids: reported", "reused handle"], errs
