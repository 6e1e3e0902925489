"""Lamport buffers across ranks: the sentinel is never confused with data (-0.0, NaN, subnormals,
the fp32 sentinel's own subnormal), buffers come back to rest after every use, and two buffers in
rotation survive many launches, dtype changes and (on GPUs) graph replays. In the CPU world, a look
that races a store and reads half of it never passes for data."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tritoncomm.channels import Channel
from tritoncomm.errors import CommTimeoutError
from tritoncomm.kernels import (
    LAMPORT_SENTINEL16,
    clock_ns,
    epoch_commit,
    heap_ptr,
    lamport_fill,
    lamport_poll,
    lamport_reset,
    lamport_store,
    lamport_try,
    program_epoch,
)

from ..conftest import BACKEND
from ..helpers import make_comm, warm_up_for_capture, world_sizes
from .lagging import lagging_reader_kernel


@triton.jit(do_not_specialize=["rank"])
def _ring_kernel(src, out, n, bases, rank, world, timeout, diag_addr, epochs_off, buf_off, slot_bytes,
                 BLOCK: tl.constexpr):
    """Rank r stores ``src`` into slot [parity] of rank r+1's buffer; polls its own slot (from r-1),
    copies what it read to ``out`` and resets the slot."""
    diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    epoch_ptr, e = program_epoch(bases, rank, epochs_off)
    parity = (e & 1).to(tl.int64)
    DT: tl.constexpr = src.dtype.element_ty
    nxt = (rank + 1) % world
    prv = (rank + world - 1) % world
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        lamport_store(heap_ptr(bases, nxt, buf_off + parity * slot_bytes, DT) + offs, tl.load(src + offs, mask=m), m)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        mine = heap_ptr(bases, rank, buf_off + parity * slot_bytes, DT) + offs
        v = lamport_poll(mine, m, prv, start, rank, timeout, diag)
        tl.store(out + offs, v, mask=m)
        lamport_reset(mine, m)
    epoch_commit(epoch_ptr, e)


@triton.jit
def _try_kernel(out_missing, n, bases, rank, buf_off, BLOCK: tl.constexpr):
    """One look at my slot 0 without waiting: how many elements are still at the sentinel."""
    offs = tl.arange(0, BLOCK)
    _, miss = lamport_try(heap_ptr(bases, rank, buf_off, tl.bfloat16) + offs, offs < n)
    tl.store(out_missing, tl.sum(miss, axis=0))


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """What a Lamport buffer delivers for ``t``: -0.0 as +0.0 (16-bit), the sentinel subnormal as -0.0 (fp32)."""
    if t.element_size() == 2:
        bits = t.view(torch.int16)
        return torch.where(bits == LAMPORT_SENTINEL16 - (1 << 16), torch.zeros_like(bits), bits).view(t.dtype)
    bits = t.view(torch.int32)
    return torch.where(bits == 0x80008000 - (1 << 32), torch.full_like(bits, -(1 << 31)), bits).view(t.dtype)


def _awkward(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values with -0.0, +0.0, NaN, infinities, subnormals and (fp32) the sentinel's subnormal."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    tiny = torch.finfo(dtype).tiny
    specials = torch.tensor([-0.0, 0.0, float("nan"), float("inf"), float("-inf"), tiny / 4, -tiny / 4, -tiny],
                            dtype=dtype)
    if dtype == torch.float32:
        specials = torch.cat([specials, torch.tensor([-(1 << 31) + 0x8000], dtype=torch.int32).view(torch.float32)])
    k = min(n, specials.numel())
    x[:k] = specials[:k]
    if n > 2 * k:
        x[n // 2:n // 2 + k] = specials[:k]
    return x


def _job_ring(ctx, launches, sizes, graph):
    comm = make_comm(ctx)
    slot = 1 << 16
    ch = Channel(comm, "t.lamport", programs=1, buffer_bytes=2 * slot)
    lamport_fill(comm.heap.view(ch.buffer))
    if ctx.backend == "cuda":
        torch.cuda.synchronize()
    comm.bootstrap.barrier()
    bases, rank, world, timeout, diag = comm.kernel_args()
    dtypes = [torch.bfloat16, torch.float32, torch.float16]
    bad, at_rest = [], True
    prv = (ctx.rank + ctx.world - 1) % ctx.world
    for i in range(launches):
        dtype = dtypes[i % 3]
        n = sizes[i % len(sizes)]
        src = _awkward(n, dtype, 1000 * i + ctx.rank).to(ctx.device)
        want = _canonical(_awkward(n, dtype, 1000 * i + prv))
        out = torch.full_like(src, 7.0)
        _ring_kernel[(1,)](src, out, n, bases, rank, world, timeout, diag, ch.epochs_off, ch.buffer_off, slot,
                           BLOCK=256)
        comm.synchronize()
        if not torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)):
            bad.append((i, str(dtype), n))
        # my launch is over, so every element written into my buffer was read and reset: at rest (checked
        # before the barrier, after which a fast peer's next launch may write again)
        at_rest &= bool((comm.heap.view(ch.buffer).view(torch.int16) == LAMPORT_SENTINEL16 - (1 << 16)).all())
        comm.bootstrap.barrier()
    replayed = None
    if graph:  # captured once, replayed with fresh data in the same tensors
        n = sizes[0]
        src = torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
        out = torch.empty_like(src)
        launch = lambda: _ring_kernel[(1,)](src, out, n, bases, rank, world, timeout, diag,  # noqa: E731
                                            ch.epochs_off, ch.buffer_off, slot, BLOCK=256)
        src.copy_(_awkward(n, torch.bfloat16, ctx.rank))
        warm_up_for_capture(launch)
        comm.bootstrap.barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch()
        replayed = []
        for r in range(20):
            src.copy_(_awkward(n, torch.bfloat16, 77 * r + ctx.rank))
            torch.cuda.synchronize()
            comm.bootstrap.barrier()
            g.replay()
            comm.synchronize()
            want = _canonical(_awkward(n, torch.bfloat16, 77 * r + prv))
            diff = (out.cpu().view(torch.int16) != want.view(torch.int16)).nonzero().flatten()
            replayed.append((r, diff.numel(), diff[:4].tolist(), out.cpu()[diff[:4]].tolist(), want[diff[:4]].tolist()))
    ch.close()
    comm.close()
    return bad, at_rest, replayed


def _job_try(ctx, n):
    comm = make_comm(ctx)
    ch = Channel(comm, "t.lamport.try", programs=1, buffer_bytes=1 << 12)
    lamport_fill(comm.heap.view(ch.buffer))
    bases, rank, _, _, _ = comm.kernel_args()
    got = torch.zeros(1, dtype=torch.int32, device=ctx.device)
    _try_kernel[(1,)](got, n, bases, rank, ch.buffer_off, BLOCK=1024)
    comm.synchronize()
    before = int(got.item())
    comm.heap.view(ch.buffer).view(torch.bfloat16)[: n // 2] = -0.5  # half the elements written
    _try_kernel[(1,)](got, n, bases, rank, ch.buffer_off, BLOCK=1024)
    comm.synchronize()
    after = int(got.item())
    ch.close()
    comm.close()
    return before, after


@pytest.mark.parametrize("world", world_sizes(2, 3))
def test_sentinel_is_never_confused_with_data_and_buffers_come_back_to_rest(worlds, world):
    for bad, at_rest, _ in worlds(world).run(_job_ring, 24, [1, 9, 300, 1000], False):
        assert bad == [], f"wrong values delivered at (launch, dtype, n): {bad}"
        assert at_rest, "a buffer was not back at rest after a launch"


def test_try_counts_missing_elements_without_waiting(worlds):
    for before, after in worlds(2).run(_job_try, 1000):
        assert (before, after) == (1000, 500)


@pytest.mark.gpu
@pytest.mark.parametrize("world", world_sizes(2))
def test_rotation_survives_graph_replay_with_fresh_data(worlds, world):
    assert BACKEND == "cuda"
    for bad, at_rest, replayed in worlds(world).run(_job_ring, 6, [4096, 333], True):
        assert bad == [] and at_rest
        assert all(bad_elems == 0 for _, bad_elems, *_ in replayed), replayed


# -- the CPU world: a look that races a store ------------------------------------------------------------------
@triton.jit
def _look_kernel(buf, vals, missing, n, rank, timeout, diag_addr, POLL: tl.constexpr, BLOCK: tl.constexpr):
    """One ``lamport_try`` (or a ``lamport_poll``) of ``buf[:n]``: the values and what was missing."""
    offs = tl.arange(0, BLOCK)
    m = offs < n
    if POLL:
        v = lamport_poll(buf + offs, m, 0, 0, rank, timeout, diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64)))
        miss = tl.zeros([BLOCK], tl.int32)
    else:
        v, miss = lamport_try(buf + offs, m)
    tl.store(vals + offs, v, mask=m)
    tl.store(missing + offs, miss, mask=m)


class _TornLoad:
    """Stands in for the interpreter's C module. The first 16-bit load that covers ``addr`` sees a
    store of ``bits`` land while it reads that element, the way glibc's two-byte ``memcpy`` (a byte,
    then a word) can: the old low byte and the new high byte."""

    def __init__(self, real, addr: int, bits: int) -> None:
        self.real, self.addr, self.bits, self.torn = real, addr, bits, None

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def load(self, ptrs, mask, other, dtype):
        hit = np.nonzero(ptrs == self.addr)[0] if self.torn is None and dtype.itemsize == 2 else []
        if len(hit) == 0:
            return self.real.load(ptrs, mask, other, dtype)
        before = self.real.load(ptrs, mask, other, dtype).view(np.uint16)
        ctypes.c_uint16.from_address(self.addr).value = self.bits  # the store lands mid-load
        out = self.real.load(ptrs, mask, other, dtype)
        i = hit[0]
        self.torn = (self.bits & 0xFF00) | (int(before[i]) & 0x00FF)
        out.view(np.uint16)[i] = self.torn
        return out


def _job_torn(ctx):
    from triton.runtime import interpreter

    comm = make_comm(ctx)
    _, rank, _, timeout, diag = comm.kernel_args()
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        for poll in (False, True):
            n, at = 64, 37
            buf = torch.empty(n, dtype=dtype)
            lamport_fill(buf)
            value = torch.tensor([1.5 if dtype == torch.bfloat16 else 2.75], dtype=dtype)  # low byte not 0x00
            bits = int(value.view(torch.int16).item()) & 0xFFFF
            if poll:  # every other element already written: the poll's first look is the racing one
                keep = buf[at].clone()
                buf.copy_(torch.arange(n, dtype=dtype) + 1)
                buf[at] = keep
            vals = torch.full((n,), 7.0, dtype=dtype)
            missing = torch.full((n,), -1, dtype=torch.int32)
            real = interpreter._interpreter
            interpreter._interpreter = proxy = _TornLoad(real, buf.data_ptr() + at * 2, bits)
            try:
                _look_kernel[(1,)](buf, vals, missing, n, rank, timeout, diag, POLL=poll, BLOCK=64)
            finally:
                interpreter._interpreter = real
            got = int(vals[at:at + 1].view(torch.int16).item()) & 0xFFFF
            out[(str(dtype), poll)] = (proxy.torn is not None and proxy.torn != bits, int(missing[at]), got == bits,
                                       int(missing.sum()) - int(missing[at]))
    comm.close()
    return out


@pytest.mark.skipif(BACKEND == "cuda", reason="the interpreter's loads: a GPU loads an aligned element whole")
def test_a_half_stored_element_never_passes_for_data(worlds):
    for (dtype, poll), (torn, missing, right, others_missing) in worlds(1).run(_job_torn)[0].items():
        assert torn, (dtype, poll)  # the race was staged: the racing look read a value that was never stored
        if poll:  # the poll returns a load made after every element was seen: the whole value
            assert right and missing == 0 and others_missing == 0, (dtype, missing, right)
        else:  # the try that raced reports the element missing (or, never here, the whole value)
            assert missing == 1 or right, (dtype, missing, right)
            assert others_missing == 63, dtype  # the elements still at rest are missing


# -- GPUs: a reset waits for every thread's look (``lagging``) ------------------------------------------------
def _job_lagging_reader(ctx, warps: int):
    """Per prompt warp: (values read, buffer back at rest, timeout error) with the barrier; then
    without it, the first prompt warp whose run timed out (the warp that stores a replicated
    element's reset is one of the program's, which one is Triton's choice), or None."""
    out = {}
    comm = make_comm(ctx, timeout_s=1.0)
    for sync in (True, False):
        for prompt in range(warps):
            _, rank, _, timeout, diag = comm.kernel_args()
            buf = comm.empty(4, torch.float32)
            lamport_fill(buf)
            got = torch.full((4,), -7.0, device=ctx.device)
            lagging_reader_kernel[(2,)](buf, got, rank, timeout, diag, prompt, 30_000_000, 1_000_000, SYNC=sync,
                                        BLOCK=4, num_warps=warps)
            try:
                comm.synchronize()
                err = None
            except CommTimeoutError as e:
                err = str(e)
            rest = bool((buf.view(torch.int16) == LAMPORT_SENTINEL16 - (1 << 16)).all())
            if sync:
                out[prompt] = (got.tolist(), rest, err)
                comm.free(buf)
            elif err is not None:
                out["staged"] = (prompt, err)
                break
            else:
                comm.free(buf)
    comm.bootstrap.barrier()
    comm.close()
    return out


@pytest.mark.skipif(BACKEND != "cuda", reason="out-of-step warps: GPUs only (the interpreter runs a program whole)")
def test_a_reset_waits_for_every_warps_look(worlds):
    """One warp of program 0 sees the data 1 ms in; the others look 30 ms in. With the barrier in
    ``lamport_reset`` every warp reads it before it goes back to rest, whichever warp is prompt;
    without it (``SYNC=False``), where the prompt warp is the one that stores the reset, the others
    poll the sentinel until the time limit: the race that stopped MoE dispatch on its top-k weights."""
    res = worlds(1).run(_job_lagging_reader, 4)[0]
    for prompt in range(4):
        got, rest, err = res[prompt]
        assert err is None and got == [1.0, 2.0, 3.0, 4.0] and rest, (prompt, res[prompt])
    assert "staged" in res, res  # without the barrier some prompt warp left the others polling
    assert "still at the sentinel" in res["staged"][1], res["staged"]


# -- GPUs: a block of one element per thread is returned from its last look ------------------------------------
@triton.jit
def _trickle_kernel(buf, out, rank, timeout, diag_addr, gap_ns, BLOCK: tl.constexpr):
    """Program 1 stores ``BLOCK`` values into ``buf`` one at a time, ``gap_ns`` apart, the last
    element first; program 0 polls the whole block (no reload when it has an element per thread),
    keeps what it read in ``out`` and resets the block."""
    offs = tl.arange(0, BLOCK)
    if tl.program_id(0) == 1:
        for i in range(BLOCK):
            t0 = clock_ns()
            while clock_ns() - t0 < gap_ns:
                pass
            j = BLOCK - 1 - i
            lamport_store(buf + j, (j + 1).to(tl.float32))
    else:
        diag = diag_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
        v = lamport_poll(buf + offs, offs < BLOCK, 1, 0, rank, timeout, diag)
        lamport_reset(buf + offs)
        tl.store(out + offs, v)


def _job_trickle(ctx):
    """Per (warps, block): (values read are the values stored, buffer back at rest)."""
    comm = make_comm(ctx, timeout_s=2.0)
    _, rank, _, timeout, diag = comm.kernel_args()
    out = {}
    for warps in (4, 8):
        for block in (32 * warps, 64 * warps):  # one and two elements per thread
            buf = comm.empty(block, torch.float32)
            lamport_fill(buf)
            got = torch.full((block,), -7.0, device=ctx.device)
            _trickle_kernel[(2,)](buf, got, rank, timeout, diag, 2_000, BLOCK=block, num_warps=warps)
            comm.synchronize()
            want = torch.arange(1, block + 1, dtype=torch.float32, device=ctx.device)
            rest = bool((buf.view(torch.int16) == LAMPORT_SENTINEL16 - (1 << 16)).all())
            out[(warps, block)] = (bool(torch.equal(got, want)), rest)
            comm.free(buf)
    comm.bootstrap.barrier()
    comm.close()
    return out


@pytest.mark.skipif(BACKEND != "cuda", reason="a writer racing the poll within one launch: GPUs only")
def test_a_poll_of_an_element_per_thread_returns_every_value(worlds):
    """A writer stores a block's elements one at a time (2 µs apart) while the reader polls the whole
    block: with at least one element per thread the poll returns its last look's values, which must
    hold every stored value (no copy of an element in another thread still at the sentinel)."""
    res = worlds(1).run(_job_trickle)[0]
    assert all(ok and rest for ok, rest in res.values()), res
