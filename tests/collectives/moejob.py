"""The MoE tests' job: dispatch and combine calls against a reference built from every rank's tokens
and routing (gathered over gloo), with the reference's rules for values (canonical -0.0, FP8 rows and
scales, the combine's order of sums) and a check that every Lamport buffer is at rest after the calls."""

from __future__ import annotations

import torch

from tritoncomm.collectives.moe import MoEAllToAll

from ..helpers import make_comm
from ..integrations.enginetest import gathered


def routing(g: torch.Generator, n: int, experts: int, k: int, local: int, case: str) -> torch.Tensor:
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(n)]) if n else \
        torch.empty(0, k, dtype=torch.int64)
    if case == "one-rank" and n:  # every expert of token 0 on rank 0
        ids[0] = torch.arange(k) % local
    if case == "hot" and n:  # expert 1 chosen by every token: with a small capacity, drops
        others = torch.tensor([x for x in range(experts) if x != 1])
        ids = torch.stack([torch.cat([torch.tensor([1]), others[torch.randperm(len(others), generator=g)[:k - 1]]])
                           for _ in range(n)])
    if case == "unrouted" and n:  # some entries with no expert (-1), one token with none at all
        ids[torch.rand(n, k, generator=g) < 0.3] = -1
        ids[0] = -1
    if case == "repeats" and n:  # an expert twice in a row (top-k never does this; the slots must still count it)
        ids[::2, k - 1] = ids[::2, 0]
    return ids


def reference(ctx, xs, idl, max_tokens: int, k: int, local: int, capacity: int):
    """Per local expert: the kept rows in slot order (sources from the expert's owner on, ``o, o +
    1, ...``, then token, then j) and the entry count; per own entry: its (expert, slot) or None when
    dropped or unrouted; the entries dropped on this rank's experts."""
    w, r = ctx.world, ctx.rank
    rows: dict[int, list] = {el: [] for el in range(local)}
    mine: dict[tuple[int, int], tuple[int, int] | None] = {(t, j): None for t in range(max_tokens) for j in range(k)}
    counts: dict[int, int] = {}
    for e in range(local * w):
        o, taken = e // local, 0
        for i in range(w):
            s = (o + i) % w
            for t in range(max_tokens):
                for j in range(k):
                    if int(idl[s][t, j]) != e:
                        continue
                    if taken < capacity:
                        if o == r:
                            rows[e - r * local].append(xs[s][t])
                        if s == r:
                            mine[(t, j)] = (e, taken)
                    taken += 1
        if o == r:
            counts[e - r * local] = taken
    dropped = sum(max(c - capacity, 0) for c in counts.values())
    return rows, counts, mine, dropped


#: The fp32 Lamport sentinel's bits as int32 (kernels/lamport.py): a weight with them travels as -0.0.
FP32_SENTINEL = 0x80008000 - (1 << 32)


def canonical(t: torch.Tensor) -> torch.Tensor:
    """What dispatch delivers of ``t`` (any float dtype): -0.0 as +0.0, and an fp32 at the sentinel
    word as -0.0 (the Lamport packets' rule, applied on every path)."""
    t = torch.where(t == 0, torch.zeros_like(t), t)
    if t.dtype == torch.float32:
        t = torch.where(t.view(torch.int32) == FP32_SENTINEL, torch.full_like(t, -0.0), t)
    return t


def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference FP8 dispatch of rows ``x``: e4m3 values (-0.0 as +0.0) and one fp32 scale per 128
    columns."""
    g = x.float().view(*x.shape[:-1], -1, 128)
    scale = g.abs().amax(-1).clamp_min(1e-12) / 448.0
    q = (g / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q.view(torch.uint8)[q.view(torch.uint8) == 0x80] = 0
    return q.view(x.shape), scale


def deq(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float().view(*q.shape[:-1], -1, 128) * scale[..., None]).view(q.shape)


def fp8_mismatch(got: torch.Tensor, want: torch.Tensor, cpu: bool) -> int:
    """Values that differ; in the CPU world e4m3 subnormals may differ by one step (the interpreter's
    conversion), so those are not counted there."""
    diff = got.view(torch.uint8) != want.view(torch.uint8)
    if cpu:
        near = ((got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs() == 1) & \
            (want.float().abs() < 2 ** -6)
        diff &= ~near
    return int(diff.sum())


def combined(x, wts, where, n: int, k: int, local: int, world: int, dtype, fp8: bool) -> torch.Tensor:
    """The combine's rule: per owner rank the fp32 sum in ``j`` order rounded to the dtype (-0.0 as
    +0.0), the partials summed in fp32 in rank order; the experts are ``y = x * (e + 1)`` rounded to
    the dtype."""
    want = torch.zeros(n, x.shape[1])
    for t in range(n):
        parts = [torch.zeros(x.shape[1]) for _ in range(world)]
        for j in range(k):
            if where[(t, j)] is not None:
                e = where[(t, j)][0]
                xt = deq(*quant(x[t])) if fp8 else canonical(x[t]).float()
                parts[e // local] = parts[e // local] + canonical(wts[t, j].float()) * \
                    (xt * float(e + 1)).to(dtype).float()
        acc = torch.zeros(x.shape[1])
        for p in parts:
            acc = acc + (p.to(dtype).float() + 0.0)  # a partial of -0.0 counts as +0.0
        want[t] = acc
    return want.to(dtype)


def lamport_buffers(moe: MoEAllToAll) -> list[tuple[str, torch.Tensor]]:
    """The instance's Lamport buffers: the combine's and, with packets, the one-kernel dispatch's."""
    names = {"lamport_partials": "combine", "packet_rows": "rows", "packet_scales": "scales",
             "packet_weights": "weights", "copies": "copies"}
    return [(names[name], b) for name, b in moe.buffers().items() if name in names]


def not_at_rest(buf: torch.Tensor) -> int:
    """Elements of a Lamport buffer not at rest (``kernels/lamport.py``: 0x80 per byte of 8-bit
    buffers, 0x8000 per 16-bit half of others)."""
    if buf.element_size() == 1:
        return int((buf.view(torch.uint8) != 0x80).sum())
    return int((buf.view(torch.int16) != -(1 << 15)).sum())


def job(ctx, experts: int, k: int, hidden: int, max_tokens: int, case: str, reps: int, dtype=torch.bfloat16,
         capacity=None, ids_dtype=torch.int64, w_dtype=torch.float32, fp8=False, mode="auto", throughput_from=256,
         both_modes=False, shape=None, call_tokens=None, bound_odd=False, full=False, decode_shape=None):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    w, r, dev = ctx.world, ctx.rank, ctx.device
    local = experts // w
    moe = MoEAllToAll(comm, max_tokens=max_tokens, hidden=hidden, num_experts=experts, top_k=k, dtype=dtype,
                      capacity=capacity, fp8_dispatch=fp8, mode=mode, throughput_from=throughput_from, shape=shape,
                      decode_shape=decode_shape)
    cap = moe.capacity
    bad, dropped, totals = [], 0, []
    for rep in range(reps):
        g = torch.Generator().manual_seed(1000 * rep + 17 * r + 3)
        most = call_tokens or max_tokens  # tokens per rank and call at most
        n = int(torch.randint(0, most + 1, (1,), generator=g))
        if rep == 0 and r == w - 1:
            n = 0  # a rank with no tokens
        if rep == 1 or full:
            n = most
        x = torch.randn(n, hidden, generator=g).to(dtype)
        ids = routing(g, n, experts, k, local, case)
        wts = torch.rand(n, k, generator=g).to(w_dtype)
        if case == "sentinels" and n:  # the Lamport sentinels' values in the data (kernels/lamport.py)
            x[:, ::3] = -0.0
            x[:, 1::3] *= 2.0 ** -130  # subnormals
            wts.view(-1)[::5] = -0.0
            if w_dtype == torch.float32:  # the 32-bit sentinel word as a weight
                wts.view(torch.int32).view(-1)[1::5] = FP32_SENTINEL
        # ids as a strided view when there is room for one
        ids_dev = ids.to(ids_dtype).to(dev)
        if rep == 2:
            ids_dev = torch.stack([ids_dev, ids_dev], 2).reshape(n, 2 * k)[:, ::2]
        bufs = moe.buffers()
        bufs["experts"].view(torch.uint8).fill_(0x7F)  # poison
        if fp8:
            bufs["scales"].fill_(float("nan"))
        bufs["combined"].fill_(float("nan"))
        bound = {"tokens_bound": most} if bound_odd and rep % 2 else {}
        out, counts, handle = moe.dispatch(x.to(dev), ids_dev, wts.to(dev), **bound)
        totals.append(int(sum(gathered(ctx, torch.tensor([n])))))
        xs = gathered(ctx, torch.cat([x, torch.zeros(max_tokens - n, hidden, dtype=x.dtype)]))
        idl = gathered(ctx, torch.cat([ids, torch.full((max_tokens - n, k), -1, dtype=ids.dtype)]))
        rows, want_counts, where, dropped_here = reference(ctx, xs, idl, max_tokens, k, local, cap)
        for el in range(local):
            c = int(counts[el])
            if c != min(want_counts[el], cap):
                bad.append((rep, "count", el, c, want_counts[el]))
            elif rows[el] and not fp8 and not torch.equal(out[el, :c].cpu().view(torch.int16),
                                                          canonical(torch.stack(rows[el])).view(torch.int16)):
                bad.append((rep, "rows", el))
            elif rows[el] and fp8:
                q, sc = quant(torch.stack(rows[el]))
                got_q, got_sc = out[0][el, :c].cpu(), out[1][el, :c].cpu()
                if not torch.equal(got_sc, sc) or fp8_mismatch(got_q, q, dev.type == "cpu"):
                    bad.append((rep, "fp8 rows", el))
        dropped += dropped_here
        # experts: y = x * (e + 1), rounded to the dtype
        scale = (torch.arange(local) + r * local + 1).float().to(dev)
        y = ((deq(*out) if fp8 else out.float()) * scale[:, None, None]).to(dtype)
        comb = moe.combine(y, handle).cpu()
        want = combined(x, wts, where, n, k, local, w, dtype, fp8)
        if case == "sentinels":  # the subnormal columns' sums not compared: the interpreter's fp32
            keep = torch.arange(hidden) % 3 != 1  # products of subnormals are not IEEE's
            comb, want = comb[:, keep], want[:, keep]
        if not torch.equal(comb, want):
            bad.append((rep, "combine", (comb.float() - want.float()).abs().max().item() if n else None))
    torch.cuda.synchronize() if dev.type == "cuda" else None
    ctx.barrier()
    for name, buf in lamport_buffers(moe):  # every packet read and reset: the Lamport buffers are at rest again
        busy = not_at_rest(buf)
        if busy:
            bad.append((f"lamport buffer {name} not at rest", busy))
    if both_modes and len({t >= throughput_from for t in totals}) != 2:
        bad.append(("calls of one mode only", totals))
    if moe.dropped() != dropped:
        bad.append(("dropped", moe.dropped(), dropped))
    moe.close()
    comm.close()
    return bad
