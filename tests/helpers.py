"""Helpers that run inside ranks."""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

import tritoncomm as tc
from tritoncomm.collectives import Choice, SelectionTable


def only_worlds() -> tuple[int, ...]:
    """The sizes in ``TRITONCOMM_TEST_WORLDS`` (comma-separated, e.g. ``8`` on an 8-GPU machine); empty
    when it is not set. With it set, the ``worlds`` fixture skips tests that ask for any other size."""
    return tuple(int(w) for w in os.environ.get("TRITONCOMM_TEST_WORLDS", "").split(",") if w.strip())


def world_sizes(*default: int) -> tuple[int, ...]:
    """World sizes a parametrized test runs at: ``only_worlds()`` when set, else ``default``."""
    return only_worlds() or default


def dealt(variants: list, *default: int) -> list[tuple]:
    """``(world, *variant)`` rows for ``pytest.mark.parametrize``: with ``TRITONCOMM_TEST_WORLDS`` set,
    every variant at each of those sizes; else the variants dealt over ``default`` in turn (the
    first to the first size, the second to the second, ...), so that each variant runs once and
    each size runs some of them. A variant that is not a tuple is one value."""
    rows = [v if isinstance(v, tuple) else (v,) for v in variants]
    if only_worlds():
        return [(w, *v) for w in only_worlds() for v in rows]
    return [(default[i % len(default)], *v) for i, v in enumerate(rows)]


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_comm(ctx, **config) -> tc.Communicator:
    # In the CPU world interpreted kernels share two cores with every other rank: a generous bound keeps
    # a starved-but-alive rank from failing a test.
    config.setdefault("timeout_s", 30.0 if ctx.backend == "cuda" else 300.0)
    return tc.Communicator(ctx.cpu_group, config=tc.CommConfig(**config))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def same_on_all_ranks(ctx, t: torch.Tensor) -> bool:
    out: list = [None] * ctx.world
    dist.all_gather_object(out, digest(t), group=ctx.cpu_group)
    return all(d == out[0] for d in out)


def reference_sum(ctx, x: torch.Tensor) -> torch.Tensor:
    """torch.distributed all-reduce of ``x`` in fp32 on the CPU group (gloo)."""
    ref = x.detach().float().cpu().clone()
    dist.all_reduce(ref, group=ctx.cpu_group)
    return ref


def check_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """Max error relative to max |ref|; raises AssertionError when above the dtype's tolerance."""
    o = out.detach().float().cpu()
    assert not torch.isnan(o).any(), "output has NaN (unwritten poison?)"
    err = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]} for {dtype}"
    return err


def warm_up_for_capture(fn) -> None:
    """GPU: run ``fn`` once on a side stream (it compiles and allocates there, as torch advises before a
    CUDA-graph capture) and wait for it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def small_table(world: int) -> SelectionTable:
    """Boundaries at 2, 4, 6, 12 and 16 KiB, so short tests cross every algorithm (the LL two-shot
    first: the smallest sizes leave some ranks' shards empty)."""
    rows = {}
    for dtype in ("bf16", "fp16", "fp32"):
        rows[("allreduce", world, dtype)] = [(2048, Choice("ll_twoshot", 2, 256, 1)), (4096, Choice("ll", 2, 256, 1)),
                                             (6144, Choice("lamport", 2, 512, 1)),
                                             (12288, Choice("lamport_twoshot", 2, 256, 1)),
                                             (16384, Choice("oneshot", 2, 512, 1)),
                                             (1 << 40, Choice("twoshot", 2, 512, 1))]
    return SelectionTable(rows, "test")


def bit_mismatches(ctx, got: torch.Tensor, want: torch.Tensor, tag: tuple) -> list:
    """``tag`` + what is wrong: ``got`` differs from ``want`` in any bit, or ranks hold different bits."""
    bad = []
    if not torch.equal(got.view(torch.int16).cpu(), want.view(torch.int16).cpu()):
        bad.append((*tag, "differs from the reference run"))
    if not same_on_all_ranks(ctx, got):
        bad.append((*tag, "ranks differ"))
    return bad
