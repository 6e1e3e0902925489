"""MoE dispatch and combine against a reference built from every rank's tokens and routing (gathered
over gloo): random routing with edge cases, token counts that differ per rank and per call (zero
included), "no expert" ids, full experts (capacity drops), every dtype of ids, weights and tokens,
both combine modes and calls switching between them, outputs poisoned before each call; exact
expert layouts and counts, exact combine bits; bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tritoncomm.collectives.moe import NEVER, SHAPES, MoEAllToAll, MoEShape
from tritoncomm.collectives.selection import read_table
from tritoncomm.errors import CommTimeoutError, InvalidInputError

from ..conftest import BACKEND
from ..helpers import dealt, make_comm, warm_up_for_capture, world_sizes
from ..integrations.enginetest import gathered


def _routing(g: torch.Generator, n: int, experts: int, k: int, local: int, case: str) -> torch.Tensor:
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


def _reference(ctx, xs, idl, max_tokens: int, k: int, local: int, capacity: int):
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
_FP32_SENTINEL = 0x80008000 - (1 << 32)


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """What dispatch delivers of ``t`` (any float dtype): -0.0 as +0.0, and an fp32 at the sentinel
    word as -0.0 (the Lamport packets' rule, applied on every path)."""
    t = torch.where(t == 0, torch.zeros_like(t), t)
    if t.dtype == torch.float32:
        t = torch.where(t.view(torch.int32) == _FP32_SENTINEL, torch.full_like(t, -0.0), t)
    return t


def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference FP8 dispatch of rows ``x``: e4m3 values (-0.0 as +0.0) and one fp32 scale per 128
    columns."""
    g = x.float().view(*x.shape[:-1], -1, 128)
    scale = g.abs().amax(-1).clamp_min(1e-12) / 448.0
    q = (g / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q.view(torch.uint8)[q.view(torch.uint8) == 0x80] = 0
    return q.view(x.shape), scale


def _deq(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float().view(*q.shape[:-1], -1, 128) * scale[..., None]).view(q.shape)


def _fp8_mismatch(got: torch.Tensor, want: torch.Tensor, cpu: bool) -> int:
    """Values that differ; in the CPU world e4m3 subnormals may differ by one step (the interpreter's
    conversion), so those are not counted there."""
    diff = got.view(torch.uint8) != want.view(torch.uint8)
    if cpu:
        near = ((got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs() == 1) & \
            (want.float().abs() < 2 ** -6)
        diff &= ~near
    return int(diff.sum())


def _combined(x, wts, where, n: int, k: int, local: int, world: int, dtype, fp8: bool) -> torch.Tensor:
    """The combine's rule: per owner rank the fp32 sum in ``j`` order rounded to the dtype (-0.0 as
    +0.0), the partials summed in fp32 in rank order; the experts are ``y = x * (e + 1)`` rounded to
    the dtype."""
    want = torch.zeros(n, x.shape[1])
    for t in range(n):
        parts = [torch.zeros(x.shape[1]) for _ in range(world)]
        for j in range(k):
            if where[(t, j)] is not None:
                e = where[(t, j)][0]
                xt = _deq(*_quant(x[t])) if fp8 else _canonical(x[t]).float()
                parts[e // local] = parts[e // local] + _canonical(wts[t, j].float()) * \
                    (xt * float(e + 1)).to(dtype).float()
        acc = torch.zeros(x.shape[1])
        for p in parts:
            acc = acc + (p.to(dtype).float() + 0.0)  # a partial of -0.0 counts as +0.0
        want[t] = acc
    return want.to(dtype)


def _lamport_buffers(moe: MoEAllToAll) -> list[tuple[str, torch.Tensor]]:
    """The instance's Lamport buffers: the combine's and, with packets, the one-kernel dispatch's."""
    names = {"lamport_partials": "combine", "packet_rows": "rows", "packet_scales": "scales",
             "packet_weights": "weights", "copies": "copies"}
    return [(names[name], b) for name, b in moe.buffers().items() if name in names]


def _not_at_rest(buf: torch.Tensor) -> int:
    """Elements of a Lamport buffer not at rest (``kernels/lamport.py``: 0x80 per byte of 8-bit
    buffers, 0x8000 per 16-bit half of others)."""
    if buf.element_size() == 1:
        return int((buf.view(torch.uint8) != 0x80).sum())
    return int((buf.view(torch.int16) != -(1 << 15)).sum())


def _job(ctx, experts: int, k: int, hidden: int, max_tokens: int, case: str, reps: int, dtype=torch.bfloat16,
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
        ids = _routing(g, n, experts, k, local, case)
        wts = torch.rand(n, k, generator=g).to(w_dtype)
        if case == "sentinels" and n:  # the Lamport sentinels' values in the data (kernels/lamport.py)
            x[:, ::3] = -0.0
            x[:, 1::3] *= 2.0 ** -130  # subnormals
            wts.view(-1)[::5] = -0.0
            if w_dtype == torch.float32:  # the 32-bit sentinel word as a weight
                wts.view(torch.int32).view(-1)[1::5] = _FP32_SENTINEL
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
        rows, want_counts, where, dropped_here = _reference(ctx, xs, idl, max_tokens, k, local, cap)
        for el in range(local):
            c = int(counts[el])
            if c != min(want_counts[el], cap):
                bad.append((rep, "count", el, c, want_counts[el]))
            elif rows[el] and not fp8 and not torch.equal(out[el, :c].cpu().view(torch.int16),
                                                          _canonical(torch.stack(rows[el])).view(torch.int16)):
                bad.append((rep, "rows", el))
            elif rows[el] and fp8:
                q, sc = _quant(torch.stack(rows[el]))
                got_q, got_sc = out[0][el, :c].cpu(), out[1][el, :c].cpu()
                if not torch.equal(got_sc, sc) or _fp8_mismatch(got_q, q, dev.type == "cpu"):
                    bad.append((rep, "fp8 rows", el))
        dropped += dropped_here
        # experts: y = x * (e + 1), rounded to the dtype
        scale = (torch.arange(local) + r * local + 1).float().to(dev)
        y = ((_deq(*out) if fp8 else out.float()) * scale[:, None, None]).to(dtype)
        comb = moe.combine(y, handle).cpu()
        want = _combined(x, wts, where, n, k, local, w, dtype, fp8)
        if case == "sentinels":  # the subnormal columns' sums not compared: the interpreter's fp32
            keep = torch.arange(hidden) % 3 != 1  # products of subnormals are not IEEE's
            comb, want = comb[:, keep], want[:, keep]
        if not torch.equal(comb, want):
            bad.append((rep, "combine", (comb.float() - want.float()).abs().max().item() if n else None))
    torch.cuda.synchronize() if dev.type == "cuda" else None
    ctx.barrier()
    for name, buf in _lamport_buffers(moe):  # every packet read and reset: the Lamport buffers are at rest again
        busy = _not_at_rest(buf)
        if busy:
            bad.append((f"lamport buffer {name} not at rest", busy))
    if both_modes and len({t >= throughput_from for t in totals}) != 2:
        bad.append(("calls of one mode only", totals))
    if moe.dropped() != dropped:
        bad.append(("dropped", moe.dropped(), dropped))
    moe.close()
    comm.close()
    return bad


@pytest.mark.parametrize("world,case,mode", [(w, "random", m) for w in world_sizes(2, 3, 4)
                                              for m in ("latency", "throughput")]
                         + dealt([(c, m) for c in ("one-rank", "hot", "unrouted") for m in ("latency", "throughput")],
                                 4, 3, 2))
def test_dispatch_combine_match_reference(worlds, world, case, mode):
    """Random routing in both modes at world 2, 3 and 4; the other cases (a token's experts all on
    one rank, an expert that every token routes to, experts that receive nothing) each once, over
    the three sizes."""
    experts = max(2 * world, 4) if case != "hot" else 4 * world
    for bad in worlds(world).run(_job, experts, 3, 40, 6, case, 3, mode=mode):
        assert bad == []


@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_many_decode_calls_in_a_row(worlds, mode):
    """200 calls (4 in the CPU world) of 6 tokens of top-3 over 4 experts at world 2: on GPUs the
    one-kernel dispatch with packets and the call check, whose copies (2 x 32 entries) are fewer than
    a program's threads, so Triton holds each entry in two threads and a poll's count sees one of
    them. Every call's rows, counts and combine must match the reference."""
    reps = 200 if BACKEND == "cuda" else 4
    for bad in worlds(2).run(_job, 4, 3, 40, 6, "random", reps, mode=mode):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("max_tokens", [1, 4])
def test_instances_of_a_few_tokens_called_full(worlds, world, max_tokens):
    """The instances ``tune --op moe`` measures (``max_tokens`` = the tokens of every call, hidden 256,
    16 experts, top-4), in the latency mode, called five times (each Lamport half used again) with
    every token on every rank."""
    for bad in worlds(world).run(_job, 16, 4, 256, max_tokens, "random", 5, mode="latency", full=True):
        assert bad == []


@pytest.mark.parametrize("world,case,routing", dealt([("hot", "held"), ("unrouted", "routed"),
                                                        ("hot", "routed-packets"), ("unrouted", "routed-barrier"),
                                                        ("hot", "routed-direct"), ("unrouted", "held"),
                                                        ("hot", "routed-no-lookahead"), ("unrouted", "routed-single"),
                                                        ("hot", "held-single")], 3, 2))
def test_two_kernel_dispatch_matches_reference(worlds, world, case, routing):
    """The send + gather dispatch (``one_kernel=False``; the one-kernel dispatch is the CPU world's
    default) lays out, counts and combines exactly as the reference, capacity drops included: with
    every send program holding the call's routing, and (``routed``: instances of more than 4 entries)
    after the route kernel, with blocks of 4 entries in superblocks of 2 (``routed-packets``: its rows
    as packets, laid out as they arrive; ``routed-barrier``: the route kernel with a barrier of its own;
    ``routed-direct``: the rows sent into their first kept slot on each peer; ``routed-no-lookahead``: the
    send's loads not one column block ahead; ``-single``: the peers' rows laid out one at a time, not
    two, ``MoEShape.paired_layout``; with pairs a program of the two here lays out 3 rows of a source
    of 6, one pair and one row alone)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, paired_layout=not routing.endswith("-single"))
    if not routing.startswith("held"):
        shape = replace(shape, route_above=4, block_e=4, super_blocks=2, routed_packets=routing == "routed-packets",
                        route_barrier=routing == "routed-barrier",
                        direct_from_bytes=0 if routing == "routed-direct" else NEVER,
                        routed_lookahead=routing != "routed-no-lookahead")
    for bad in worlds(world).run(_job, 4 * world, 3, 40, 6, case, 3, capacity=4 if case == "hot" else None,
                                 mode="throughput", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "direct", "fp8", "shares"], 2, 3, 4))
def test_interleaved_send_kernel_matches_reference(worlds, world, variant):
    """``MoEShape.interleave_from``: each routed send program sends the first half of its rows,
    then alternates one row of its second half with one of the first half each peer's counterpart
    sent it, and lays out the rest after its barrier (in pairs where a source gives every program
    two rows or more). Up to 30 tokens per rank over the 2 programs here (one rank with none in the
    first call), capacity drops (hot experts), every call exact: through the receive buffer, with
    the rows sent into their first kept slot (``direct``), with FP8 scales, and at one or two tokens
    per rank, where one row is split into two column shares (``shares``)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, interleave_from=1,
                    direct_from_bytes=0 if variant == "direct" else NEVER)
    hidden = 128 if variant in ("fp8", "shares") else 40
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(_job, 4 * world, 3, hidden, max_tokens, "hot", 4, capacity=max_tokens * 2 // 3,
                                 fp8=variant == "fp8", mode="throughput", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "both", "shares", "fp8"], 2, 3, 4))
def test_interleaved_throughput_combine_matches_reference(worlds, world, variant):
    """``MoEShape.combine_interleave_from``: the throughput combine pushes the first half of each
    program's partials, adds up the first half of its own tokens while it pushes the second, and
    the rest after its barrier. Up to 30 tokens per rank over the 2 programs here (one rank with none
    in the first call), capacity drops, every call exact and the bits as without it (the reference
    sums in rank order); ``both``: with the interleaved send kernel too; ``shares``: at one or two
    tokens per rank, where a token's columns split into two shares (hidden 128); ``fp8``: after an
    FP8 dispatch (hidden 128)."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2,
                    combine_interleave_from=1, interleave_from=1 if variant == "both" else NEVER)
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(_job, 4 * world, 3, 40 if variant in ("plain", "both") else 128, max_tokens, "hot",
                                 4, capacity=max_tokens * 2 // 3, mode="throughput", shape=shape, fp8=variant == "fp8"):
        assert bad == []


@pytest.mark.parametrize("world,chunks,variant", dealt([(c, v) for c in (1, 3, 8) for v in ("plain", "shares", "fp8")],
                                                        2, 3, 4))
def test_chunked_throughput_combine_matches_reference(worlds, world, chunks, variant):
    """``MoEShape.combine_chunks`` 1, 3 and 8: no barrier; each program pushes its partials chunk by
    chunk, publishes each chunk and sums its own tokens of the chunk before, its own part computed
    from the expert buffer. Up to 30 tokens per rank over the 2 programs (one rank with none in the
    first call: chunks with nothing to push or sum), capacity drops, four calls in a row (each
    publishes higher counts than the last), every call exact and the bits as without it (the
    reference sums in rank order); ``shares``: one or two tokens per rank, a token's columns in two
    shares; ``fp8``: after an FP8 dispatch."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, combine_chunks=chunks)
    max_tokens = 2 if variant == "shares" else 30
    for bad in worlds(world).run(_job, 4 * world, 3, 40 if variant == "plain" else 128, max_tokens, "hot", 4,
                                 capacity=max_tokens * 2 // 3, mode="throughput", shape=shape, fp8=variant == "fp8"):
        assert bad == []


@pytest.mark.parametrize("world,variant", dealt(["plain", "interleaved", "chunked"], 2, 3))
def test_throughput_items_wider_than_a_step(worlds, world, variant):
    """Throughput items of twice ``THROUGHPUT_STEP`` columns (as on H200s), summed one step at a
    time in each throughput combine (``plain``, ``interleaved``, ``chunked``): hidden two items
    and 40 columns, so that an item's second step and the last item are partial."""
    from tritoncomm.collectives.moe.partials import THROUGHPUT_STEP

    extra = {"interleaved": {"combine_interleave_from": 1}, "chunked": {"combine_chunks": 3}}.get(variant, {})
    shape = replace(SHAPES["cpu"], one_kernel=False, throughput_block_h=2 * THROUGHPUT_STEP, **extra)
    for bad in worlds(world).run(_job, 2 * world, 2, 4 * THROUGHPUT_STEP + 40, 3, "random", 2, mode="throughput",
                                 shape=shape):
        assert bad == []


def test_chunked_combine_excludes_the_interleaved_one():
    """Both use the combine's second barrier slots, with different counts: a shape asking for both is refused."""
    with pytest.raises(InvalidInputError, match="combine_chunks"):
        replace(SHAPES["cpu"], combine_chunks=2, combine_interleave_from=1)


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_interleaved_and_plain_calls_alternate_on_one_instance(worlds, world):
    """The interleaved send kernel and combine are chosen per call by its bound (``interleave_from``,
    ``combine_interleave_from``: 20 tokens on an instance of 30): calls without ``tokens_bound`` take
    them, every other call, given ``tokens_bound=10``, does not, so the half slots skip a call's
    epoch between uses. Six calls of at most 10 tokens per rank, every one exact."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, interleave_from=20,
                    combine_interleave_from=20)
    for bad in worlds(world).run(_job, 4 * world, 3, 40, 30, "hot", 6, capacity=20, mode="throughput", shape=shape,
                                 call_tokens=10, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,super_blocks", [(2, 1), (3, 32)])
def test_slots_past_one_load_of_histogram_rows(worlds, world, super_blocks):
    """``route.row_slots`` loads the first ``BLOCK_B`` (here 16) superblock rows and the block rows in
    one round and sums any further rows after: with one entry per block, superblocks of one block
    (a row of 40 tokens has up to 39 superblocks before it) and of 32 blocks (up to 31 block rows
    before it) both take the rows past the first load, on the routed dispatch and its layout."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=1, super_blocks=super_blocks)
    for bad in worlds(world).run(_job, 2 * world, 1, 8, 40, "random", 2, capacity=24, mode="latency",
                                 shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_direct_rows_with_fp8_scales(worlds, world):
    """Rows sent into their first kept slot on each peer (``MoEShape.direct_from_bytes``) with FP8
    dispatch: the values and their scales arrive in that slot and are copied into the row's other slots, with
    capacity drops (hot experts), every call exact."""
    shape = replace(SHAPES["cpu"], one_kernel=False, route_above=4, block_e=4, super_blocks=2, direct_from_bytes=0)
    for bad in worlds(world).run(_job, 4 * world, 3, 128, 6, "hot", 3, capacity=4, fp8=True, mode="throughput",
                                 shape=shape):
        assert bad == []


def _paths(ctx):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    small = replace(SHAPES["cpu"], programs=1)
    got = []
    for tokens, shape, decode in ((4, None, None), (400, replace(SHAPES["cpu"], route_above=4), small),
                                  (400, replace(SHAPES["cpu"], route_above=1 << 16), small),
                                  (400, replace(SHAPES["cpu"], one_kernel=False, route_above=4), None),
                                  (400, replace(SHAPES["cpu"], route_above=4, direct_from_bytes=340 * 40 * 2), small)):
        moe = MoEAllToAll(comm, max_tokens=tokens, hidden=40, num_experts=4 * ctx.world, top_k=3, shape=shape,
                          decode_shape=decode, decode_below=8)
        got.append([(path, sh is moe.decode_shape) for path, sh in (moe.dispatch_path(), moe.dispatch_path(5),
                                                                     moe.dispatch_path(300), moe.dispatch_path(350))])
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2))
def test_dispatch_path_names_the_kernels_a_call_launches(worlds, world):
    """``MoEAllToAll.dispatch_path`` (no bound; a bound of 5 tokens, of 300 and of 350, top-3, at most
    1024 entries in one kernel in the CPU world): a decode-sized instance always one kernel; a large
    routed one the route and send kernels, but one kernel with the decode shape for 5 tokens and with
    its own for 300; a large one under ``route_above`` the send and gather kernels likewise; with
    ``one_kernel=False`` never one kernel; with ``direct_from_bytes`` 340 x 40 x 2 the routed calls of at least 340
    tokens (no bound: 400) into the peers' slots."""
    one = [("one-kernel", True), ("one-kernel", False)]
    for got in worlds(world).run(_paths):
        assert got == [[("one-kernel", False)] * 4, [("routed", False), *one, ("routed", False)],
                       [("send-gather", False), *one, ("send-gather", False)], [("routed", False)] * 4,
                       [("routed-direct", False), *one, ("routed-direct", False)]]


def _direct_paths(ctx):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    shape = replace(SHAPES["cpu"], route_above=4, direct_from_bytes=400 * 128 + 1)
    got = []
    for fp8 in (False, True):
        moe = MoEAllToAll(comm, max_tokens=400, hidden=128, num_experts=4 * ctx.world, top_k=3, shape=shape,
                          fp8_dispatch=fp8)
        experts = moe.buffers()["experts"]
        got.append((moe.dispatch_path()[0], moe.dispatch_path(399)[0], comm.heap_offset(experts) is not None))
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2))
def test_direct_switch_counts_bytes_on_the_wire(worlds, world):
    """``direct_from_bytes`` counts a call's rows in bytes on the wire: 400 tokens of hidden 128 are
    102400 bytes in bf16 and 51200 with FP8 dispatch, so a switch at 51201 sends the bf16 rows
    straight into the peers' slots (and puts that instance's expert buffer in the heap), not the
    FP8 ones; a bound of 399 tokens is 102144 bytes, still direct in bf16."""
    for got in worlds(world).run(_direct_paths):
        assert got == [("routed-direct", "routed-direct", True), ("routed", "routed", False)]


def _heap_use(ctx):
    from tritoncomm.collectives.moe import heap_bytes_bound

    comm = make_comm(ctx, heap_bytes=64 << 20)
    cpu = SHAPES["cpu"]
    cases = [dict(max_tokens=6), dict(max_tokens=400, shape=replace(cpu, route_above=4)),
             dict(max_tokens=400, shape=replace(cpu, route_above=4, direct_from_bytes=0), fp8_dispatch=True),
             dict(max_tokens=400, shape=replace(cpu, route_above=4, packets=True, routed_packets=True)),
             dict(max_tokens=400, shape=replace(cpu, one_kernel=False, route_above=1 << 16), mode="throughput"),
             dict(max_tokens=40, capacity=7, fp8_dispatch=True, mode="latency"),
             dict(max_tokens=40, shape=replace(cpu, packets=True), dtype=torch.float16)]
    got = []
    for case in cases:
        before = comm.heap.allocator.used_bytes
        moe = MoEAllToAll(comm, hidden=128, num_experts=4 * ctx.world, top_k=3, **case)
        used = comm.heap.allocator.used_bytes - before
        kw = {k: v for k, v in case.items() if k != "mode"}
        got.append((used, heap_bytes_bound(comm.backend, comm.device, ctx.world, hidden=128,
                                           num_experts=4 * ctx.world, top_k=3, **kw)))
        moe.close()
    comm.close()
    return got


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_heap_bytes_bound_holds_every_path(worlds, world):
    """``heap_bytes_bound`` (what an engine sizes a communicator by) is at least what an instance
    takes from the heap on every path (one kernel, routed, routed into the peers' slots with FP8,
    routed packets, send + gather, a capacity of its own, packets in fp16), and not more than a few
    MiB plus three times it."""
    for got in worlds(world).run(_heap_use):
        for used, bound in got:
            assert used <= bound <= 3 * used + (4 << 20), got


@pytest.mark.parametrize("world,routing", dealt(["held", "routed", "routed-direct", "routed-packets"], 3, 2))
def test_decode_calls_on_large_instances_take_one_kernel(worlds, world, routing):
    """An instance sized for more routing entries than one kernel holds (400 tokens of top-3), called
    with at most 5 tokens: calls given ``tokens_bound`` (every other one) dispatch in one kernel,
    the others through the send and gather (``held``) or route and send (``routed``; with
    ``routed-packets`` both on the same packet buffers; with ``routed-direct`` into the peers'
    expert slots, between one-kernel calls that lay out the same buffer) kernels, on the same
    buffers; every call exact."""
    if routing == "held" and worlds(world).backend == "cuda":
        pytest.skip("a send program would hold 2048 routing entries: GPUs hold at most ONE_KERNEL_ENTRIES")
    shape = replace(SHAPES["cpu"], route_above=1 << 16) if routing == "held" else \
        replace(SHAPES["cpu"], route_above=4, routed_packets=routing == "routed-packets",
                direct_from_bytes=0 if routing == "routed-direct" else NEVER)
    for bad in worlds(world).run(_job, 4 * world, 3, 24, 400, "hot", 4, capacity=6, mode="throughput", shape=shape,
                                 call_tokens=5, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,mode,instance", dealt([("latency", "routed"), ("throughput", "routed"),
                                                        ("throughput", "one-kernel"), ("latency", "one-kernel")],
                                                       3, 2))
def test_decode_calls_on_large_instances_launch_narrower(worlds, world, mode, instance):
    """As above (``routed``; ``one-kernel``: an instance of 40 tokens, whose every call takes one
    kernel), the calls given ``tokens_bound`` launching their dispatch and combine with
    ``decode_shape``, 2 programs of the channels' 3 (one sending, one laying out), the others with
    all 3: every program of a wide launch must find the epoch (the tables' half) that the narrow one
    left, and every call is exact."""
    shape = replace(SHAPES["cpu"], programs=3, route_above=4)
    tokens = 400 if instance == "routed" else 40
    for bad in worlds(world).run(_job, 4 * world, 3, 24, tokens, "hot", 5, capacity=6, mode=mode, shape=shape,
                                 call_tokens=5, bound_odd=True, decode_shape=replace(SHAPES["cpu"], programs=2)):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2))
def test_decode_calls_on_default_large_instances(worlds, world):
    """An instance with the default shapes sized for 160 tokens of top-8 (on GPUs the prefill shape;
    calls given ``tokens_bound`` take the default ``decode_shape``), called with at most 5 tokens,
    every other call bounded: every call exact."""
    for bad in worlds(world).run(_job, 8 * world, 8, 256, 160, "random", 4, mode="auto", call_tokens=5,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,limit", dealt([8, 2048], 3, 2))
def test_one_kernel_entries_moves_the_one_kernel_limit(worlds, world, limit):
    """``MoEShape.one_kernel_entries``: at 8, an instance of 40 tokens of top-3 dispatches calls
    given ``tokens_bound=2`` (6 entries) in one kernel and the others in two; at 2048 one of 400
    tokens dispatches every call in one kernel. Every call exact."""
    if worlds(world).backend == "cuda" and limit > 1024:
        pytest.skip("2048 entries in a program's registers: a CPU-world check of the bookkeeping")
    shape = replace(SHAPES["cpu"], one_kernel_entries=limit)
    tokens, most = (40, 2) if limit == 8 else (400, 5)
    for bad in worlds(world).run(_job, 4 * world, 3, 24, tokens, "random", 4, capacity=12, shape=shape,
                                 call_tokens=most, bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,shared_from", dealt([0, 1 << 20], 3, 2))
def test_routing_copies_sized_by_the_bound(worlds, world, shared_from):
    """``MoEShape.bounded_copies`` on a one-kernel instance of 40 tokens of top-3: calls given
    ``tokens_bound=2`` send copies of 8 entries, the others of 128, alternating on the same copy
    table (one shared copy, or one per program); every call exact and every Lamport buffer at rest
    after them."""
    shape = replace(SHAPES["cpu"], bounded_copies=True, shared_copy_from=shared_from)
    for bad in worlds(world).run(_job, 4 * world, 3, 24, 40, "random", 4, shape=shape, call_tokens=2,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,path", dealt(["one-kernel", "routed"], 3, 2))
def test_an_expert_twice_in_a_row(worlds, world, path):
    """Every other token names its first expert again as its last: each entry gets its own slot, in
    ``(token, j)`` order, on the one-kernel and the routed dispatch, capacity drops included, every
    other call bounded; every call exact."""
    shape = None if path == "one-kernel" else replace(SHAPES["cpu"], one_kernel=False, route_above=4)
    for bad in worlds(world).run(_job, 4 * world, 3, 24, 40, "repeats", 4, capacity=8, shape=shape, call_tokens=12,
                                 bound_odd=True):
        assert bad == []


def _traced_job(ctx, path: str) -> list[bool]:
    """The same calls on an instance with stage stamps on (``trace_stages``) and on one without:
    the traced builds (other kernels) give the same bits, the stamps' tensors have the stages'
    shapes, and with rows for 3 calls the two calls write rows 0 and 1 of their path's dispatch
    stamps and of the combine's, not row 2 (poisoned before); the routed layout's first item taken
    alone (``routed-single``: no pairs) stamps its start and its slots."""
    from tritoncomm.collectives.moe.combine import COMBINE_STAGES
    from tritoncomm.collectives.moe.onekernel import DISPATCH_STAGES
    from tritoncomm.collectives.moe.route import ROUTED_STAGES

    comm = make_comm(ctx, heap_bytes=64 << 20)
    shape = replace(SHAPES["cpu"], one_kernel=path == "one-kernel", route_above=4,
                    paired_layout=path != "routed-single")
    got, checks = [], []
    for traced in (False, True):
        moe = MoEAllToAll(comm, max_tokens=6, hidden=40, num_experts=4 * ctx.world, top_k=2, shape=shape)
        if traced:
            stamps = moe.trace_stages(calls=3)
            checks.append([tuple(t.shape[2:]) for t in stamps] == [(DISPATCH_STAGES, 2), (COMBINE_STAGES, 2),
                                                                   (ROUTED_STAGES, 2)])
            for t in stamps:
                t.fill_(-1)
        calls = []
        for rep in range(2):
            g = torch.Generator().manual_seed(100 * rep + ctx.rank)
            n = 6 - 2 * rep
            x = torch.randn(n, 40, generator=g).to(torch.bfloat16).to(ctx.device)
            ids = torch.rand(n, 4 * ctx.world, generator=g).topk(2).indices.to(ctx.device)
            w = torch.rand(n, 2, generator=g).to(ctx.device)
            xe, counts, h = moe.dispatch(x, ids, w)
            moe.expert_buffer().copy_(xe)
            calls.append((moe.combine(moe.expert_buffer(), h).clone(), counts.clone()))
        got.append(calls)
        moe.close()
        if traced:  # the routed stages 9-10 need a kept slot, 7-8 an item taken alone (routed-single)
            stages = {"one-kernel": DISPATCH_STAGES, "routed": 7, "routed-single": 9}[path]
            used = [stamps[0 if path == "one-kernel" else 2][:, :, :stages], stamps[1]]
            checks.append([[bool((t[row] != -1).all()) for row in range(3)] for t in used] == [[True, True, False]] * 2)
    comm.close()
    checks += [torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*got, strict=True)]
    return checks


@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("path", ["one-kernel", "routed", "routed-single"])
def test_traced_builds_give_the_same_results(worlds, world, path):
    for checks in worlds(world).run(_traced_job, path):
        assert checks == [True] * 4, checks


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_shared_and_per_program_copies_alternate(worlds, world):
    """A one-kernel instance of 4 tokens of top-3 whose shape shares the routing copy from 12
    entries: calls without a bound (12 entries) share one copy, calls given ``tokens_bound=3`` (9)
    send a copy per program, alternating on the same copy table; every call exact and every Lamport
    buffer at rest after them."""
    shape = replace(SHAPES["cpu"], shared_copy_from=12)
    for bad in worlds(world).run(_job, 4 * world, 3, 24, 4, "random", 4, shape=shape, call_tokens=3,
                                 bound_odd=True):
        assert bad == []


@pytest.mark.parametrize("world,throughput_block_h", dealt([0, 8, 32], 3, 2))
def test_auto_mode_switches_per_call_on_total_tokens(worlds, world, throughput_block_h):
    """Token counts drawn per rank and call (4 at most), the switch just below every rank's maximum:
    calls of both modes interleave on the same buffers, every one exact, with the throughput mode
    stepping as many columns as the latency mode (16), fewer, or more than a row (hidden 24)."""
    shape = replace(SHAPES["cpu"], block_h=16, throughput_block_h=throughput_block_h)
    for bad in worlds(world).run(_job, 2 * world, 2, 24, 4, "unrouted", 6, throughput_from=4 * world - 1,
                                 both_modes=True, shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_full_experts_drop_later_entries_and_count_them(worlds, world):
    """Capacity 2 with one expert in every token's top-k: entries past slot 1 are dropped, in order."""
    for bad in worlds(world).run(_job, 4 * world, 3, 24, 5, "hot", 3, capacity=2, mode="throughput"):
        assert bad == []


@pytest.mark.parametrize("dtype,ids_dtype,w_dtype", [(torch.float16, torch.int32, torch.float32),
                                                     (torch.bfloat16, torch.int32, torch.bfloat16)])
def test_every_dtype(worlds, dtype, ids_dtype, w_dtype):
    for bad in worlds(2).run(_job, 6, 2, 33, 4, "random", 3, dtype, None, ids_dtype, w_dtype):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_fp8_dispatch_scales_per_128_values(worlds, world):
    for bad in worlds(world).run(_job, 2 * world, 2, 256, 4, "random", 3, torch.bfloat16, None, torch.int64,
                                 torch.float32, True, "throughput"):
        assert bad == []


@pytest.mark.parametrize("world,mode,fp8,wide", dealt([("latency", False, False), ("throughput", False, False),
                                                       ("throughput", True, False), ("throughput", False, True)],
                                                      3, 2))
def test_rows_split_over_programs_by_column_blocks(worlds, world, mode, fp8, wide):
    """More programs than rows: rows' column blocks spread over programs (send, gather, both combine
    modes), for every token count from 0 to 6; the last block partial; the send's block twice the
    others'; routing in blocks of 4 entries (3 per row: rows straddle blocks), superblocks of 2;
    ``wide``: the throughput combine's blocks twice the others' too."""
    shape = MoEShape(programs=6, block_h=128 if fp8 else 16, block_e=4, num_warps=1, super_blocks=2,
                     send_block_h=256 if fp8 else 32, throughput_block_h=32 if wide else 0)
    hidden = 384 if fp8 else 40
    for bad in worlds(world).run(_job, 4 * world, 3, hidden, 6, "unrouted", 4, torch.bfloat16, None, torch.int64,
                                 torch.float32, fp8, mode, shape=shape):
        assert bad == []


@pytest.mark.parametrize("world,senders,fp8,shared_from,lookahead", dealt([(2, False, 1 << 20, True),
                                                                            (5, False, 0, True),
                                                                            (3, True, 0, False),
                                                                            (3, True, 1 << 20, True)], 3, 2))
def test_one_kernel_with_sending_and_layout_programs_apart(worlds, world, senders, fp8, shared_from, lookahead):
    """The one-kernel dispatch with its first ``senders`` of 6 programs sending and the others laying
    out (``MoEShape.send_programs``), and the latency combine with its first ``6 - senders`` pushing
    and the others summing (``push_programs``): rows split over either group by column blocks (three
    per row: loads one block ahead, ``MoEShape.lookahead``, or not), token counts drawn from 0 to 6,
    with a routing copy per program or one shared copy."""
    shape = MoEShape(programs=6, block_h=128 if fp8 else 16, block_e=4, num_warps=1, one_kernel=True,
                     send_programs=senders, shared_copy_from=shared_from, push_programs=6 - senders,
                     lookahead=lookahead)
    hidden = 384 if fp8 else 40
    for bad in worlds(world).run(_job, 4 * world, 3, hidden, 6, "unrouted", 4, torch.bfloat16, None, torch.int64,
                                 torch.float32, fp8, "latency", shape=shape):
        assert bad == []


@pytest.mark.parametrize("world", world_sizes(8))
@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_world8(worlds, world, mode):
    for bad in worlds(world).run(_job, 2 * world, 4, 16, 3, "random", 2, mode=mode, timeout=1500):
        assert bad == []


#: The dispatch paths by launch shape (at most 4 tokens of top-2 per rank): the default (one kernel,
#: packets, at these sizes a routing copy per program, one program sending (in combine: pushing) and
#: the other laying out (summing)), the same with one shared copy, the same with both programs
#: sending then laying out (pushing then summing), one kernel with a
#: barrier, the send and gather kernels, the route and send kernels (plain, or with its rows as
#: packets and no barrier).
PATHS = {"one-kernel": None, "shared-copy": replace(SHAPES["cpu"], shared_copy_from=0),
         "whole-roles": replace(SHAPES["cpu"], send_programs=0, push_programs=0),
         "barrier": replace(SHAPES["cpu"], packets=False),
         "held": replace(SHAPES["cpu"], one_kernel=False),
         "routed": replace(SHAPES["cpu"], one_kernel=False, route_above=4),
         "routed-packets": replace(SHAPES["cpu"], one_kernel=False, route_above=4, routed_packets=True)}


@pytest.mark.parametrize("world,path,fp8", dealt([(p, f) for p in sorted(PATHS) for f in (False, True)], 3, 2))
def test_sentinel_values_in_the_data(worlds, world, path, fp8):
    """The Lamport sentinels' values in the tokens and weights (-0.0 in a third of the columns,
    subnormals, -0.0 weights, weights at the fp32 sentinel word): every dispatch path delivers -0.0
    as +0.0 (FP8 too) and the sentinel weight as -0.0, the rows bit for bit; combine exact; every
    Lamport buffer at rest after the calls."""
    for bad in worlds(world).run(_job, 2 * world, 2, 256 if fp8 else 40, 4, "sentinels", 3, torch.bfloat16, None,
                                 torch.int64, torch.float32, fp8, "latency", shape=PATHS[path]):
        assert bad == []


def _bad_input(ctx, path: str):
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, shape=PATHS[path])
    dev, errs = ctx.device, []
    x = torch.zeros(3, 16, dtype=torch.bfloat16, device=dev)
    ids = torch.zeros(3, 2, dtype=torch.int64, device=dev)
    wts = torch.ones(3, 2, device=dev)
    for args in ((torch.zeros(5, 16, dtype=torch.bfloat16, device=dev), torch.zeros(5, 2, dtype=torch.int64,
                                                                                     device=dev), torch.ones(5, 2)),
                 (x.float(), ids, wts), (x, ids[:, :1], wts), (x, ids.float(), wts),
                 (torch.zeros(3, 32, dtype=torch.bfloat16, device=dev)[:, ::2], ids, wts)):
        try:
            moe.dispatch(*args)
            errs.append("no error")
        except InvalidInputError as e:
            errs.append(type(e).__name__)
    ids_bad = ids.clone()
    ids_bad[1, 0] = 99  # out of range: dropped now, reported at the next call
    ids_bad[0, 1] = 2 ** 32 + 1  # out of range as int64, though expert 1 once narrowed to int32
    ids_bad[2, 1] = -1  # "no expert": never reported
    out, counts, h = moe.dispatch(x, ids_bad, wts)
    # rank 0's experts 0 and 1: expert 0 has the entries (0, 0), (1, 1), (2, 0) of every rank, 1 none
    got = counts.tolist()
    errs.append("counts " + ("ok" if ctx.rank or got == [3 * ctx.world, 0] else str(got)))
    moe.combine(out, h)
    try:
        moe.dispatch(x, ids, wts)
        errs.append("no error")
    except InvalidInputError as e:
        errs.append("ids: " + ("2 expert ids outside" in str(e)) * "reported")
    _, _, h = moe.dispatch(x, ids, wts)  # the error was reported once; calls go on
    try:
        moe.combine(out, h)
        moe.combine(out, h)
        errs.append("no error")
    except InvalidInputError:
        errs.append("reused handle")
    for bad_args in (dict(num_experts=2 * ctx.world + 1), dict(top_k=0), dict(capacity=0), dict(dtype=torch.float32),
                     dict(mode="fast"), dict(throughput_from=-1), dict(shape=(2, 64, 64, 1)),
                     dict(decode_shape=replace(SHAPES["cpu"], programs=1 << 20)), dict(decode_below=-1)):
        try:
            MoEAllToAll(comm, **{**dict(max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2), **bad_args})
            errs.append("no error")
        except InvalidInputError:
            errs.append("ctor")
    moe.close()
    comm.close()
    return errs


@pytest.mark.parametrize("path", sorted(PATHS))
def test_bad_input_raises_before_waiting(worlds, path):
    """Bad arguments raise before any rank waits; ids out of range are dropped and reported at the
    next call, on every dispatch path."""
    for errs in worlds(2).run(_bad_input, path):
        assert errs == ["InvalidInputError"] * 5 + ["counts ok", "ids: reported", "reused handle"] + ["ctor"] * 9, errs


def _host_copy(ctx, path: str) -> list:
    """Calls without drops leave the host-mapped counters alone (a word poked on the host stays);
    a call with drops writes the drops' word, the cumulative count."""
    comm = make_comm(ctx, heap_bytes=16 << 20)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, capacity=2,
                      shape=PATHS[path])
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(ctx.rank)).to(torch.bfloat16).to(ctx.device)
    wts = torch.rand(4, 2).to(ctx.device)
    hot = torch.tensor([[0, 1]] * 4, device=ctx.device)  # experts 0 and 1, both rank 0's
    seen = []
    out, _, h = moe.dispatch(x[:1], hot[:1], wts[:1])  # two entries per expert: all kept
    moe.combine(out, h)
    comm.synchronize()  # on GPUs the host reads the words unsynchronised: wait for the calls before each look
    moe.memory.bad_host._array[1] = -7  # as if the drops' word held something else: only a write changes it
    out, _, h = moe.dispatch(x[:1], hot[:1], wts[:1])
    moe.combine(out, h)
    comm.synchronize()
    seen.append(moe.memory.bad_host.read())
    out, _, h = moe.dispatch(x, hot, wts)  # 4 * world entries per expert, 2 kept
    moe.combine(out, h)
    comm.synchronize()
    seen.append(moe.memory.bad_host.read())
    moe.close()
    comm.close()
    return seen


@pytest.mark.parametrize("path", ["one-kernel", "routed"])
def test_host_counters_written_only_when_they_change(worlds, path):
    """The dispatch copies its counters (bad ids, drops) into host-mapped words only where they
    changed: no host memory written by calls without either."""
    for rank, seen in enumerate(worlds(2).run(_host_copy, path)):
        assert seen == [[0, -7], [0, 2 * (4 * 2 - 2) if rank == 0 else -7]], seen


def _missing_peer(ctx, path: str):
    """Rank 1 builds the instance but never dispatches: rank 0's dispatch must end in a timeout
    that names both ranks (and, with packets, the elements still at the sentinel and their buffer)."""
    comm = make_comm(ctx, heap_bytes=16 << 20, timeout_s=1.0)
    moe = MoEAllToAll(comm, max_tokens=4, hidden=16, num_experts=2 * ctx.world, top_k=2, shape=PATHS[path])
    err = None
    if ctx.rank == 0:
        dev = ctx.device
        ids = torch.tensor([[0, 2], [3, 1], [2, 0]], device=dev)  # experts on both ranks
        try:
            moe.dispatch(torch.ones(3, 16, dtype=torch.bfloat16, device=dev), ids, torch.ones(3, 2, device=dev))
            comm.synchronize()
        except CommTimeoutError as e:
            err = (e.rank, e.peer, str(e))
    comm.bootstrap.barrier()
    moe.close()
    comm.close()
    return err


@pytest.mark.parametrize("path", ["barrier", "held", "one-kernel", "routed"])  # each kind of wait
def test_missing_peer_turns_into_timeout_error(worlds, path):
    err, _ = worlds(2).run(_missing_peer, path, timeout=300)
    assert err is not None, "no CommTimeoutError on rank 0"
    rank, peer, msg = err
    assert (rank, peer) == (0, 1) and "rank 0" in msg and "peer 1" in msg, msg
    if path == "one-kernel":  # the data is the flag; the error names the buffer that waited
        assert "still at the sentinel" in msg and "user.empty(" in msg and "of rank 0)" in msg, msg


def _gpu_shape(ctx, max_tokens: int, path: str) -> MoEShape:
    """The default launch shape (``one-kernel`` at these sizes), or the send and gather kernels with
    the route kernel before the send (instances of more than 8 entries) (``routed``; ``routed-direct``:
    every call's rows sent into their first kept slot on each peer; ``routed-chunked``: routed, the
    throughput combine in 4 chunks without its barrier)."""
    from tritoncomm.collectives.moe import default_shape

    shape = default_shape("cuda", max_tokens, torch.cuda.get_device_properties(ctx.device).multi_processor_count)
    if path == "barrier":
        return replace(shape, packets=False)
    if path == "one-kernel":
        return shape
    return replace(shape, one_kernel=False, route_above=8, direct_from_bytes=0 if path == "routed-direct" else NEVER,
                   combine_chunks=4 if path == "routed-chunked" else 0)


def _graph_job(ctx, mode: str, path: str):
    """Dispatch, experts and combine captured once in a CUDA graph, replayed with fresh tokens and
    routing copied into its inputs: every replay equals an eager run of the same inputs."""
    comm = make_comm(ctx, heap_bytes=64 << 20)
    experts, k, hidden, t = max(4, 2 * ctx.world), 2, 256, 8
    local = experts // ctx.world
    shape = _gpu_shape(ctx, t, path)
    eager = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k, mode=mode, name="moe.eager",
                        shape=shape)
    cap = MoEAllToAll(comm, max_tokens=t, hidden=hidden, num_experts=experts, top_k=k, mode=mode, name="moe.graph",
                      shape=shape)
    dev = ctx.device
    x, ids, wts = (torch.empty(t, hidden, dtype=torch.bfloat16, device=dev),
                   torch.empty(t, k, dtype=torch.int64, device=dev), torch.empty(t, k, device=dev))
    scale = (torch.arange(local, device=dev) + ctx.rank * local + 1).float()[:, None, None]

    def step(moe):
        out, _, h = moe.dispatch(x, ids, wts)
        moe.expert_buffer().copy_((out.float() * scale).to(torch.bfloat16))
        return moe.combine(moe.expert_buffer(), h)

    def fill(seed):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(t, hidden, generator=g).to(torch.bfloat16))
        ids.copy_(torch.rand(t, experts, generator=g).topk(k).indices)
        wts.copy_(torch.rand(t, k, generator=g))

    fill(ctx.rank)
    warm_up_for_capture(lambda: step(cap))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step(cap)
    ok = []
    for rep in range(4):
        fill(100 * rep + ctx.rank)
        got.fill_(float("nan"))
        graph.replay()
        want = step(eager)
        ok.append(torch.equal(got, want))
    del graph
    eager.close()
    cap.close()
    comm.close()
    return ok


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("mode", ["latency", "throughput"])
@pytest.mark.parametrize("path", ["one-kernel", "barrier", "routed", "routed-direct", "routed-chunked"])
def test_cuda_graph_replays_with_new_routing(worlds, world, mode, path):
    for ok in worlds(world).run(_graph_job, mode, path):
        assert ok == [True] * 4, ok


def _straggler_job(ctx, calls: int, seed: int, path: str) -> list:
    """``calls`` dispatch + combine calls queued back to back with no host synchronisation, token counts
    and routing new every call (zero tokens included, unrouted entries, both combine modes), one rank's
    stream delayed before 20% of them; then the same calls again, one at a time with a host barrier
    between them. The bits must agree (they depend only on the inputs)."""
    import random

    comm = make_comm(ctx, timeout_s=60)
    experts, k, hidden, t_max = 4 * ctx.world, 3, 512, 64
    local, dev = experts // ctx.world, ctx.device
    moe = MoEAllToAll(comm, max_tokens=t_max, hidden=hidden, num_experts=experts, top_k=k, throughput_from=48,
                      shape=_gpu_shape(ctx, t_max, path))
    scale = (torch.arange(local, device=dev) + ctx.rank * local + 1).float()[:, None, None]
    schedule = random.Random(seed)  # the same on every rank
    late = [(schedule.randrange(ctx.world) if schedule.random() < 0.2 else -1, schedule.randrange(1, 2_000_000))
            for _ in range(calls)]
    inputs = []
    for i in range(calls):  # on the device before the first call: no copy from the host in between
        g = torch.Generator().manual_seed(seed * 1_000_003 + i * 16 + ctx.rank)
        n = int(torch.randint(0, t_max + 1, (1,), generator=g))
        ids = torch.rand(n, experts, generator=g).topk(k).indices
        ids[torch.rand(n, k, generator=g) < 0.1] = -1
        inputs.append((torch.randn(n, hidden, generator=g).to(torch.bfloat16).to(dev), ids.to(dev),
                       torch.rand(n, k, generator=g).to(dev)))
    torch.cuda.synchronize()

    def step(x, ids, w):
        out, counts, h = moe.dispatch(x, ids, w)
        moe.expert_buffer().copy_((out.float() * scale).to(torch.bfloat16))
        return moe.combine(moe.expert_buffer(), h).clone(), counts.clone()

    got = []
    for (x, ids, w), (who, cycles) in zip(inputs, late, strict=True):
        if who == ctx.rank:
            torch.cuda._sleep(cycles)  # this rank's stream falls behind; nobody waits on the host
        got.append(step(x, ids, w))
    torch.cuda.synchronize()
    bad = []
    for i, (x, ids, w) in enumerate(inputs):
        ctx.barrier()
        comb, counts = step(x, ids, w)
        torch.cuda.synchronize()
        if not (torch.equal(got[i][0], comb) and torch.equal(got[i][1], counts)):
            bad.append(i)
    moe.close()
    comm.close()
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2))
@pytest.mark.parametrize("path", ["one-kernel", "barrier", "routed", "routed-direct", "routed-chunked"])
def test_stragglers_with_no_host_sync(worlds, world, path):
    for bad in worlds(world).run(_straggler_job, 200, 11, path, timeout=600):
        assert bad == []


def test_default_launch_shape_follows_the_instance_size():
    from tritoncomm.collectives.moe import PREFILL_FROM, default_shape

    decode, prefill = default_shape("cuda", PREFILL_FROM - 1, 132), default_shape("cuda", PREFILL_FROM, 132)
    assert (decode.programs, decode.num_warps, decode.one_kernel) == (132, 4, True)
    assert (prefill.programs, prefill.num_warps, prefill.one_kernel) == (264, 8, True)
    assert default_shape("cpu", 10_000, 1) == SHAPES["cpu"]
    # the prefill send steps 2048 columns for rows of at most NARROW_SEND_UP_TO, 4096 for wider ones
    from tritoncomm.collectives.moe import NARROW_SEND_UP_TO

    assert prefill.send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO).send_block_h == 2048
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO + 128).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=NARROW_SEND_UP_TO, wire_bytes=1).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM, 132, hidden=1024, wire_bytes=4).send_block_h == 4096
    assert default_shape("cuda", PREFILL_FROM - 1, 132, hidden=4096) == decode
    # past two ranks the one-kernel dispatch stops at half the routing entries (the routed path beyond)
    from tritoncomm.collectives.moe import PREFILL_ONE_KERNEL_ENTRIES, PREFILL_ONE_KERNEL_ENTRIES_WIDE

    assert PREFILL_ONE_KERNEL_ENTRIES_WIDE < PREFILL_ONE_KERNEL_ENTRIES == prefill.one_kernel_entries
    assert default_shape("cuda", PREFILL_FROM, 132, world=4).one_kernel_entries == PREFILL_ONE_KERNEL_ENTRIES_WIDE
    assert default_shape("cuda", PREFILL_FROM - 1, 132, world=4) == decode
    # the interleaved send kernel: where the device table's switches give it, for wide rows of 2-byte elements
    h200 = {w: read_table("cuda", "NVIDIA H200").switches_for("moe", w) for w in (2, 4, 8)}
    wide = NARROW_SEND_UP_TO + 128
    for world in (2, 4):
        named = default_shape("cuda", PREFILL_FROM, 132, hidden=wide, world=world, switches=h200[world])
        assert named.interleave_from == h200[world]["interleave_from_tokens"] == 2048, world
    assert prefill.interleave_from == NEVER  # no switches
    for kw in ({"hidden": NARROW_SEND_UP_TO, "world": 2}, {"hidden": wide, "wire_bytes": 1, "world": 2},
               {"hidden": wide, "world": 8}):
        assert default_shape("cuda", PREFILL_FROM, 132, switches=h200[kw["world"]], **kw).interleave_from == NEVER, kw
    # the interleaved combine: at EP4 on an H200, any row width and wire
    for kw in ({"hidden": NARROW_SEND_UP_TO}, {"hidden": wide}, {"hidden": wide, "wire_bytes": 1}):
        named = default_shape("cuda", PREFILL_FROM, 132, world=4, switches=h200[4], **kw)
        assert named.combine_interleave_from == 4096, kw
        for world in (2, 8):
            assert default_shape("cuda", PREFILL_FROM, 132, world=world, switches=h200[world],
                                 **kw).combine_interleave_from == NEVER, (world, kw)
    assert default_shape("cuda", PREFILL_FROM, 132, world=4).combine_interleave_from == NEVER  # no switches
    assert default_shape("cuda", PREFILL_FROM - 1, 132, world=4, switches=h200[4]).combine_interleave_from == NEVER
    # the combine's switch: the H200's tokens per rank at EP2; the element rule elsewhere
    from tritoncomm.collectives.moe import THROUGHPUT_FROM_ELEMS_EP2, default_throughput_from

    assert default_throughput_from(2, 7168, h200[2]) == 2 * 448
    assert default_throughput_from(2, 7168) == -(-THROUGHPUT_FROM_ELEMS_EP2 * 2 // 7168)
    assert default_throughput_from(4, 7168, h200[4]) == default_throughput_from(4, 7168)


def test_role_split_resolves_from_the_shape_and_the_call():
    """``send_programs`` at -1 (the default) resolves to the programs over the world (with packets
    only), ``push_programs`` to half the programs (while ``bound * hidden`` is at most
    ``push_split_elems``), explicit values stand, and values outside ``[-1, programs)`` are refused."""
    from tritoncomm.collectives.moe import PUSH_SPLIT_ELEMS, default_shape

    sh = default_shape("cuda", 8, 132)
    assert sh.senders() == sh.senders(2) == sh.senders(1) == 66 and replace(sh, packets=False).senders() == 0
    assert sh.senders(3) == 44 and sh.senders(4) == 33 and replace(sh, send_programs=10).senders(4) == 10
    assert replace(sh, programs=2).senders(4) == 1  # the CPU world's two programs keep one of each
    assert replace(sh, send_programs=0).senders() == 0 and replace(sh, send_programs=10).senders() == 10
    assert sh.pushers(8, PUSH_SPLIT_ELEMS // 8) == 66 and sh.pushers(8, PUSH_SPLIT_ELEMS // 8 + 1) == 0
    assert sh.pushers(16, 7168) == 0 and sh.pushers(8, 7168) == 66 and sh.pushers(16, 4096) == 66
    assert replace(sh, push_programs=5).pushers(10_000, 7168) == 5
    for bad in (dict(send_programs=-2), dict(send_programs=132), dict(push_programs=132), dict(push_programs=-2),
                dict(push_split_elems=-1), dict(packets=False, send_programs=3)):
        with pytest.raises(InvalidInputError):
            replace(sh, **bad)


def test_default_combine_switch_counts_elements_received():
    """The automatic combine switch (``default_throughput_from``): the fewest total tokens with
    ``THROUGHPUT_FROM_ELEMS`` (at world 2 ``THROUGHPUT_FROM_ELEMS_EP2``) elements of partials received
    per rank, ``tokens * hidden * (world - 1) / world``. The points they were set between: at EP4
    DeepSeek-V3 (hidden 7168) at 128 tokens per rank in the throughput mode and Qwen3-MoE (4096) at
    128 in the latency mode; at EP2 DeepSeek-V3 at 384 and Qwen3-MoE at 640 in the latency mode,
    DeepSeek-V3 at 448 and Qwen3-MoE at 704 in the throughput mode."""
    from tritoncomm.collectives.moe import THROUGHPUT_FROM_ELEMS, THROUGHPUT_FROM_ELEMS_EP2, default_throughput_from

    for world, hidden in ((2, 7168), (4, 7168), (2, 4096), (4, 4096), (3, 100), (8, 7168)):
        t = default_throughput_from(world, hidden)
        elems = THROUGHPUT_FROM_ELEMS_EP2 if world == 2 else THROUGHPUT_FROM_ELEMS
        assert t * hidden * (world - 1) >= elems * world > (t - 1) * hidden * (world - 1)
    assert default_throughput_from(4, 7168) <= 4 * 128 < default_throughput_from(4, 4096)
    assert 2 * 384 < default_throughput_from(2, 7168) <= 2 * 448
    assert 2 * 640 < default_throughput_from(2, 4096) <= 2 * 704
    h100 = read_table("cuda", "NVIDIA H100 80GB HBM3").switches_for("moe", 2)
    assert default_throughput_from(2, 4096, h100) == default_throughput_from(2, 4096)


def test_default_combine_switch_counts_tokens_at_ep2_on_h200s():
    """At EP2 on H200s the switch counts tokens per rank for every hidden size (the latency mode won
    at 384 tokens per rank for both shapes, the throughput mode from 448); elsewhere on H200s, and
    on other GPUs, the elements rule stands."""
    from tritoncomm.collectives.moe import default_throughput_from

    h200 = {w: read_table("cuda", "NVIDIA H200").switches_for("moe", w) for w in (2, 3, 4, 8)}
    for hidden in (7168, 4096, 100):
        t = default_throughput_from(2, hidden, h200[2])
        assert 2 * 384 < t <= 2 * 448
    assert default_throughput_from(2, 4096, h200[2]) < default_throughput_from(2, 4096)
    for world, hidden in ((4, 7168), (4, 4096), (8, 7168), (3, 100)):
        assert default_throughput_from(world, hidden, h200[world]) == default_throughput_from(world, hidden)
