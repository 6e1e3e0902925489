"""The CPU world's interpreter without work that changes nothing (``tritoncomm/kernels/interpreter.py``):
kernels that call helpers give the same bits as under Triton's own interpreter, the language is
restored after every launch, and helper calls do not patch it; int32 arithmetic that overflows
gives the same bits with Triton's overflow checks and without them, which assert nothing there; the
numpy dtype of every Triton dtype is Triton's own answer."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tritoncomm.kernels import round_to

from ..conftest import BACKEND


@triton.jit
def _int_kernel(a, b, out, BLOCK: tl.constexpr):
    """int32 sums, differences and products, some of which overflow."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(a + offs)
    y = tl.load(b + offs)
    tl.store(out + offs, x + y)
    tl.store(out + BLOCK + offs, x - y)
    tl.store(out + 2 * BLOCK + offs, x * y)


@triton.jit
def _plus_half(v):
    return v + 0.5


@triton.jit
def _scaled(v, s):
    return _plus_half(v) * s


@triton.jit
def _chain_kernel(x, out, n, BLOCK: tl.constexpr):
    """Helpers called from helpers, in a loop: several helper calls per step."""
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m)
        v = round_to(_scaled(v, 3.0), tl.bfloat16).to(tl.float32)
        tl.store(out + offs, _plus_half(v), mask=m)


def _language() -> dict[tuple[str, str], object]:
    """Every attribute of the modules and class the interpreter patches, by identity."""
    return {(owner.__name__, name): value for owner in (tl, tl.core, tl.math, tl.tensor)
            for name, value in vars(owner).items()}


def _both_ways(ctx) -> list[str]:
    from triton.runtime import interpreter

    from tritoncomm.kernels.interpreter import skipping_repatching

    bad: list[str] = []
    if not skipping_repatching():
        return ["the rank's interpreter does not skip the repeated patch"]
    skipper = interpreter._patch_lang
    builtins_patched = []
    patch_builtin = interpreter._patch_builtin

    def counting(*args, **kwargs):
        builtins_patched.append(1)
        return patch_builtin(*args, **kwargs)

    g = torch.Generator().manual_seed(7 + ctx.rank)
    x = torch.randn(1000, generator=g)
    want = (((x + 0.5) * 3.0).to(torch.bfloat16).float() + 0.5)
    _chain_kernel[(1,)](x, torch.empty_like(x), 1, BLOCK=64)  # a first launch sets a few attributes for good
    before = _language()
    got, counts = {}, {}
    interpreter._patch_builtin = counting
    try:
        for way, patch in (("skipping", skipper), ("triton", skipper.__wrapped__)):
            interpreter._patch_lang = patch
            builtins_patched.clear()
            out = torch.full_like(x, float("nan"))
            _chain_kernel[(2,)](x, out, x.numel(), BLOCK=64)
            got[way], counts[way] = out, len(builtins_patched)
            if _language() != before:
                bad.append(f"{way}: the language is not restored after the launch")
    finally:
        interpreter._patch_lang = skipper
        interpreter._patch_builtin = patch_builtin
    for way, out in got.items():
        if not torch.equal(out, want):
            bad.append(f"{way}: wrong result")
    if not torch.equal(got["skipping"].view(torch.int32), got["triton"].view(torch.int32)):
        bad.append("the two ways differ")
    # two launches' worth of patching (one per program) against one per helper call besides
    if not 0 < 10 * counts["skipping"] <= counts["triton"]:
        bad.append(f"module patches: {counts}")
    return bad


@pytest.mark.skipif(BACKEND != "cpu", reason="the interpreter runs in the CPU world")
def test_helpers_run_on_the_launchs_patch(worlds):
    for bad in worlds(2).run(_both_ways):
        assert bad == []


def _overflow_both_ways(ctx) -> list[str]:
    from dataclasses import replace

    from triton.runtime import interpreter

    bad: list[str] = []
    builder = interpreter.interpreter_builder
    ours = builder.options
    if ours.sanitize_overflow or ours.debug:
        bad.append(f"the rank's interpreter options: {ours}")
    big = 2**31 - 1
    a = torch.tensor([big, -big - 1, 7, big, 1 << 20, -5, 0, 12345], dtype=torch.int32)
    b = torch.tensor([1, -1, -9, big, 1 << 12, 3, -big - 1, -54321], dtype=torch.int32)
    want = torch.cat([(a.long() + b.long()), (a.long() - b.long()), (a.long() * b.long())])
    want = ((want + 2**31) % 2**32 - 2**31).int()  # wrapped to int32, as a GPU computes it
    got = {}
    try:
        for way, options in (("unchecked", ours), ("triton", replace(ours, sanitize_overflow=True))):
            builder.options = options
            out = torch.full((3 * a.numel(),), -7, dtype=torch.int32)
            _int_kernel[(1,)](a, b, out, BLOCK=a.numel())  # Triton's checks raise nothing: debug is off
            got[way] = out
        builder.options = replace(ours, sanitize_overflow=True, debug=True)  # only then do the checks assert
        try:
            _int_kernel[(1,)](a, b, torch.empty(3 * a.numel(), dtype=torch.int32), BLOCK=a.numel())
            bad.append("with debug on, Triton's checks did not see the overflow")
        except Exception as e:  # the interpreter wraps the assertion
            if "overflow" not in str(e):
                bad.append(f"with debug on: {e!r}")
    finally:
        builder.options = ours
    for way, out in got.items():
        if not torch.equal(out, want):
            bad.append(f"{way}: {out.tolist()} != {want.tolist()}")
    return bad


@pytest.mark.skipif(BACKEND != "cpu", reason="the interpreter runs in the CPU world")
def test_overflow_checks_assert_nothing_in_the_interpreter(worlds):
    for bad in worlds(2).run(_overflow_both_ways):
        assert bad == []


def _np_dtypes_both_ways(ctx) -> list[str]:
    from triton.runtime import interpreter

    bad: list[str] = []
    ours = interpreter._get_np_dtype
    triton_s = getattr(ours, "__wrapped__", None)
    if triton_s is None:
        return ["the rank's interpreter answers numpy dtypes with Triton's own function"]
    scalars = [v for v in vars(tl).values() if isinstance(v, tl.dtype)]
    asked = [*scalars, tl.pointer_type(tl.float32), tl.pointer_type(tl.pointer_type(tl.int8)), tl.dtype("bf16"),
             tl.dtype("fp8e4nv")]
    asked += [tl.block_type(t, [4, 2]) for t in asked]

    def answer(fn, t):
        try:
            return fn(t)
        except Exception as e:  # Triton's own error for a dtype without a numpy type
            return type(e).__name__
    for t in asked:
        if answer(ours, t) != answer(triton_s, t):
            bad.append(f"{t}: {answer(ours, t)} against Triton's {answer(triton_s, t)}")
    if len({str(answer(triton_s, t)) for t in scalars}) < 8:  # the comparison saw real answers, not one error
        bad.append("Triton's answers are too few to compare")
    # and kernels that cast through them give Triton's bits
    g = torch.Generator().manual_seed(11 + ctx.rank)
    x = torch.randn(1000, generator=g)
    got = {}
    try:
        for way, fn in (("table", ours), ("triton", triton_s)):
            interpreter._get_np_dtype = fn
            out = torch.full_like(x, float("nan"))
            _chain_kernel[(2,)](x, out, x.numel(), BLOCK=64)
            got[way] = out
    except Exception as e:  # a wrong numpy dtype can also stop the kernel
        bad.append(f"a kernel failed: {e!r}"[:300])
    finally:
        interpreter._get_np_dtype = ours
    if len(got) == 2 and not torch.equal(got["table"].view(torch.int32), got["triton"].view(torch.int32)):
        bad.append("a kernel's bits differ")
    return bad


@pytest.mark.skipif(BACKEND != "cpu", reason="the interpreter runs in the CPU world")
def test_numpy_dtypes_answered_as_triton_does(worlds):
    """Every dtype of ``triton.language``, pointers and blocks of either: the table's answer is
    Triton's (a numpy dtype, or the same error); a kernel with bf16 casts gives the same bits."""
    for bad in worlds(2).run(_np_dtypes_both_ways):
        assert bad == []
