"""Device primitives across ranks: put/get, signal/wait ordering, barrier, LL packets."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tritoncomm.channels import Channel
from tritoncomm.kernels import (
    MAX_WORLD,
    barrier,
    epoch_commit,
    epoch_next,
    fence_sys,
    get,
    heap_base,
    heap_ptr,
    ll8_pack,
    ll8_poll,
    ll8_store,
    ll8_try,
    ll8_unpack,
    put,
    signal,
    signal_add,
    signal_relaxed,
    translate,
    wait,
    wait_relaxed,
)

from ..conftest import BACKEND
from ..helpers import make_comm, world_sizes

# --------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _put_get_kernel(src, out_put, out_get, n, bases, rank, world, timeout, diag_addr, flags_off, epochs_off, buf_off,
                    half_bytes, BLOCK: tl.constexpr):
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    e = epoch_next(ep)
    nxt = (rank + 1) % world
    prv = (rank + world - 1) % world
    DT: tl.constexpr = src.dtype.element_ty
    put(heap_ptr(bases, rank, buf_off + half_bytes, DT), src, n, BLOCK)  # stage my data in my Y
    put(heap_ptr(bases, nxt, buf_off, DT), src, n, BLOCK)  # push my data into next's X
    barrier(bases, rank, world, flags_off, 0, e, timeout, diag)
    get(out_put, heap_ptr(bases, rank, buf_off, DT), n, BLOCK)  # what prev pushed to me
    get(out_get, heap_ptr(bases, prv, buf_off + half_bytes, DT), n, BLOCK)  # pull prev's Y
    barrier(bases, rank, world, flags_off, 1, e, timeout, diag)
    epoch_commit(ep, e)


@triton.jit
def _handshake_kernel(out_bad, rounds, n, bases, rank, world, timeout, diag_addr, flags_off, epochs_off, buf_off,
                      BLOCK: tl.constexpr):
    """Ring ping-pong: each round writes fresh data into the next rank, signals, and waits for the
    previous rank's data; a wait that returned early would read the last round's values."""
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    base = epoch_next(ep) - 1
    nxt = (rank + 1) % world
    prv = (rank + world - 1) % world
    offs = tl.arange(0, BLOCK)
    m = offs < n
    data_flag_at_next = heap_ptr(bases, nxt, flags_off, tl.uint32) + rank  # slot 0, lane rank
    data_flag_mine = heap_ptr(bases, rank, flags_off, tl.uint32) + prv
    ack_flag_at_prev = heap_ptr(bases, prv, flags_off, tl.uint32) + MAX_WORLD + rank  # slot 1
    ack_flag_mine = heap_ptr(bases, rank, flags_off, tl.uint32) + MAX_WORLD + nxt
    bad = 0
    for k in range(1, rounds + 1):
        r = base + k
        # next has consumed round r-1, also across launches (for k = 1 that is the previous launch's
        # last round; 0 on a fresh channel)
        wait_relaxed(ack_flag_mine, r - 1, nxt, 1, rank, timeout, diag)
        fence_sys()
        tl.store(heap_ptr(bases, nxt, buf_off, tl.int32) + offs, (r * 1000 + rank * 7 + offs).to(tl.int32), mask=m)
        signal(data_flag_at_next, r)
        wait(data_flag_mine, r, prv, 0, rank, timeout, diag)
        v = tl.load(heap_ptr(bases, rank, buf_off, tl.int32) + offs, mask=m)
        bad += tl.sum(((v != (r * 1000 + prv * 7 + offs).to(tl.int32)) & m).to(tl.int32), axis=0)
        tl.debug_barrier()
        signal_relaxed(ack_flag_at_prev, r)
    tl.store(out_bad, bad)
    epoch_commit(ep, base + rounds)


@triton.jit
def _barrier_kernel(out_bad, iters, bases, rank, world, timeout, diag_addr, flags_off, epochs_off, buf_off):
    """``iters`` barriers in a row. Before each, a rank publishes its round in a cell; after it,
    every peer's cell must show this round or the next one (a peer may already be one ahead)."""
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    first = epoch_next(ep)
    lanes = tl.arange(0, MAX_WORLD)
    valid = lanes < world
    cells = (heap_base(bases, tl.where(valid, lanes, rank)) + buf_off).to(tl.pointer_type(tl.uint32))
    mine = heap_ptr(bases, rank, buf_off, tl.uint32)
    bad = 0
    for i in range(0, iters):
        e = first + i
        tl.store(mine, e)
        barrier(bases, rank, world, flags_off, 0, e, timeout, diag)
        d = tl.load(cells, mask=valid, other=0, volatile=True) - e
        bad += tl.sum((valid & (d != 0) & (d != 1)).to(tl.int32), axis=0)
    tl.store(out_bad, bad)
    epoch_commit(ep, first + iters - 1)


@triton.jit
def _ll_kernel(src, out, out_check, nwords, bases, rank, world, timeout, diag_addr, epochs_off, buf_off, slot_words,
               BLOCK: tl.constexpr):
    """Every rank sends its words to every peer as packets (slot [parity][source]) and polls what
    every peer sent; ``out`` gets the words of the previous rank. Exchanging with every peer is what
    makes two buffers (by epoch parity) enough: nobody can finish launch k+1 before every peer has
    started it, so nobody overwrites a buffer that a peer still reads (the LL contract)."""
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    e = epoch_next(ep)
    parity = (e & 1).to(tl.int64)
    prv = (rank + world - 1) % world
    w = tl.arange(0, BLOCK)
    m = w < nwords
    words = tl.load(src + w, mask=m)
    for p in range(0, world):
        if p != rank:
            dst = heap_ptr(bases, p, buf_off + (parity * MAX_WORLD + rank) * slot_words * 8, tl.uint64)
            ll8_store(dst + w, words, e, mask=m)
    for p in range(0, world):
        if p != rank:
            mine = heap_ptr(bases, rank, buf_off + (parity * MAX_WORLD + p) * slot_words * 8, tl.uint64)
            got = ll8_poll(mine + w, m, e, p, 0, rank, timeout, diag)
            if p == prv:
                tl.store(out + w, got, mask=m)
    d, f = ll8_unpack(ll8_pack(words, e))
    ok = tl.sum(((d != words.to(tl.uint32)) | (f != e)).to(tl.int32) * m.to(tl.int32), axis=0)
    tl.store(out_check, ok)
    epoch_commit(ep, e)


@triton.jit
def _try_kernel(src, out, out_missing, nwords, bases, rank, world, buf_off, flag, STORE: tl.constexpr,
                BLOCK: tl.constexpr):
    """``STORE``: write my words as packets with ``flag`` into the next rank's buffer; else one
    ``ll8_try`` of my buffer: the words and the number of packets still missing."""
    w = tl.arange(0, BLOCK)
    m = w < nwords
    if STORE:
        ll8_store(heap_ptr(bases, (rank + 1) % world, buf_off, tl.uint64) + w, tl.load(src + w, mask=m), flag, mask=m)
    else:
        words, missing = ll8_try(heap_ptr(bases, rank, buf_off, tl.uint64) + w, m, flag)
        tl.store(out + w, words, mask=m)
        tl.store(out_missing, tl.sum(missing, axis=0))


@triton.jit
def _counter_kernel(out, bases, rank, world, timeout, diag_addr, flags_off, epochs_off):
    """Every rank adds 1 to a counter on rank 0; rank 0 waits for ``world`` per launch."""
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    e = epoch_next(ep)
    counter = heap_ptr(bases, 0, flags_off, tl.uint32)
    signal_add(counter, 1)
    if rank == 0:
        wait(counter, e * world, 0, 0, rank, timeout, diag)
    tl.store(out, tl.load(heap_ptr(bases, 0, flags_off, tl.uint32), volatile=True))
    mine = heap_ptr(bases, rank, flags_off, tl.uint32)
    tl.store(out + 1, (translate(mine, bases, rank, rank).to(tl.int64) - mine.to(tl.int64)).to(tl.uint32))
    epoch_commit(ep, e)


# --------------------------------------------------------------------------------------------
# rank jobs


def _job_put_get(ctx, sizes, dtype):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.putget", programs=1, barrier_slots=2, buffer_bytes=2 * 65536)
    bases, rank, world, timeout, diag = comm.kernel_args()
    results = []
    for n in sizes:
        g = torch.Generator().manual_seed(n * 31 + rank)
        src = (torch.rand(n, generator=g) * 100).to(dtype).to(ctx.device)
        out_put = torch.full_like(src, 77)
        out_get = torch.full_like(src, 77)
        _put_get_kernel[(1,)](src, out_put, out_get, n, bases, rank, world, timeout, diag, ch.flags_off,
                              ch.epochs_off, ch.buffer_off, 32768, BLOCK=512)
        comm.synchronize()
        expect = (torch.rand(n, generator=torch.Generator().manual_seed(n * 31 + (rank - 1) % world)) * 100).to(dtype)
        results.append((n, torch.equal(out_put.cpu(), expect), torch.equal(out_get.cpu(), expect)))
    ch.close()
    comm.close()
    return results


def _job_handshake(ctx, rounds, n):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.hs", programs=1, barrier_slots=2, buffer_bytes=4 * n)
    bases, rank, world, timeout, diag = comm.kernel_args()
    bad = []
    for _ in range(2):  # two launches: epochs carry over
        out = torch.full((1,), -1, dtype=torch.int32, device=ctx.device)
        _handshake_kernel[(1,)](out, rounds, n, bases, rank, world, timeout, diag, ch.flags_off, ch.epochs_off,
                                ch.buffer_off, BLOCK=triton.next_power_of_2(n))
        comm.synchronize()
        bad.append(int(out.item()))
    ch.close()
    comm.close()
    return bad


def _job_barrier(ctx, iters, launches):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.bar", programs=1, barrier_slots=1, buffer_bytes=256)
    bases, rank, world, timeout, diag = comm.kernel_args()
    bad = []
    for _ in range(launches):
        out = torch.full((1,), -1, dtype=torch.int32, device=ctx.device)
        _barrier_kernel[(1,)](out, iters, bases, rank, world, timeout, diag, ch.flags_off, ch.epochs_off,
                              ch.buffer_off)
        comm.synchronize()
        bad.append(int(out.item()))
    ch.close()
    comm.close()
    return bad


def _job_ll(ctx, launches, nwords):
    comm = make_comm(ctx)
    slot_words = 1024
    ch = Channel(comm, "t.ll", programs=1, buffer_bytes=2 * MAX_WORLD.value * slot_words * 8)
    bases, rank, world, timeout, diag = comm.kernel_args()
    ok = []
    for k in range(launches):
        def data(r: int, k: int = k) -> torch.Tensor:
            g = torch.Generator().manual_seed(k * 1009 + r)
            return torch.randint(-2**31, 2**31 - 1, (nwords,), generator=g, dtype=torch.int64).to(torch.int32)
        src = data(rank).to(ctx.device)
        out = torch.zeros_like(src)
        check = torch.full((1,), -1, dtype=torch.int32, device=ctx.device)
        _ll_kernel[(1,)](src, out, check, nwords, bases, rank, world, timeout, diag, ch.epochs_off, ch.buffer_off,
                         slot_words, BLOCK=1024)
        comm.synchronize()
        ok.append(torch.equal(out.cpu(), data((rank - 1) % world)) and int(check.item()) == 0)
    ch.close()
    comm.close()
    return ok


def _job_try(ctx, nwords):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.try", programs=1, buffer_bytes=1024 * 8)
    bases, rank, world, _, _ = comm.kernel_args()
    src = torch.randint(-2**31, 2**31 - 1, (nwords,), generator=torch.Generator().manual_seed(rank),
                        dtype=torch.int64).to(torch.int32).to(ctx.device)
    out = torch.zeros_like(src)
    missing = torch.full((1,), -1, dtype=torch.int32, device=ctx.device)
    seen = []

    def look(flag: int) -> tuple[int, bool]:
        out.zero_()
        _try_kernel[(1,)](src, out, missing, nwords, bases, rank, world, ch.buffer_off, flag, STORE=False, BLOCK=1024)
        comm.synchronize()
        prev = torch.randint(-2**31, 2**31 - 1, (nwords,), generator=torch.Generator().manual_seed((rank - 1) % world),
                             dtype=torch.int64).to(torch.int32)
        return int(missing.item()), torch.equal(out.cpu(), prev)

    seen.append(look(5))  # nothing written yet: every packet missing
    comm.bootstrap.barrier()
    _try_kernel[(1,)](src, out, missing, nwords, bases, rank, world, ch.buffer_off, 5, STORE=True, BLOCK=1024)
    comm.synchronize()
    comm.bootstrap.barrier()
    seen.append(look(5))  # written with flag 5: none missing, the previous rank's words
    seen.append(look(6))  # a later flag: the packets are stale
    ch.close()
    comm.close()
    return seen


def _job_counter(ctx, launches):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.cnt", programs=1, barrier_slots=1)
    bases, rank, world, timeout, diag = comm.kernel_args()
    seen = []
    for _ in range(launches):
        out = torch.zeros(2, dtype=torch.int32, device=ctx.device)
        _counter_kernel[(1,)](out, bases, rank, world, timeout, diag, ch.flags_off, ch.epochs_off)
        comm.synchronize()
        seen.append(out.tolist())
        comm.bootstrap.barrier()
    ch.close()
    comm.close()
    return seen


# --------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("world", world_sizes(2, 3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_put_get_odd_sizes(worlds, world, dtype):
    sizes = [1, 7, 511, 513, 1000, 4097]
    for rank_results in worlds(world).run(_job_put_get, sizes, dtype):
        for n, put_ok, get_ok in rank_results:
            assert put_ok, f"put of {n} elements ({dtype}) delivered wrong data"
            assert get_ok, f"get of {n} elements ({dtype}) read wrong data"


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_signal_wait_handshake_never_reads_stale_data(worlds, world):
    """200 handshakes on GPUs, 100 in the CPU world (CI)."""
    for bad in worlds(world).run(_job_handshake, 200 if BACKEND == "cuda" else 100, 300):
        assert bad == [0, 0], f"{bad} stale or wrong elements read after wait"


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_barrier_many_times(worlds, world):
    """1000 barriers in a launch on GPUs, 250 in the CPU world (CI), twice."""
    for bad in worlds(world).run(_job_barrier, 1000 if BACKEND == "cuda" else 250, 2):
        assert bad == [0, 0], "a barrier returned before a peer arrived"


@pytest.mark.parametrize("world", world_sizes(2, 4))
def test_ll_packets_across_epochs(worlds, world):
    if world < 2:
        pytest.skip("packets need a peer to cross to")
    for ok in worlds(world).run(_job_ll, 30, 777):
        assert all(ok), f"LL delivery wrong at launches {[i for i, v in enumerate(ok) if not v]}"


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_ll8_try_reports_missing_packets_without_waiting(worlds, world):
    for before, after, stale in worlds(world).run(_job_try, 777):
        assert before[0] == 777, before
        assert after == (0, True), after
        assert stale == (777, True), stale  # the data words are there, their flag is not the one asked for


def test_signal_add_counts_every_rank(worlds):
    world = 3
    results = worlds(world).run(_job_counter, 5)
    for launch, (value, translated) in enumerate(results[0]):
        assert value >= world * (launch + 1), f"rank 0 saw counter {value} at launch {launch}"
        assert translated == 0
