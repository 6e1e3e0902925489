"""``Launcher``: the same results as ``kernel[grid](...)`` whatever the arguments' specialisation, and
on GPUs the short path launches exactly the compiled kernel Triton itself picks, through its C entry
point (``direct``) and through Triton's wrapper around it."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tritoncomm.kernels import Launcher
from tritoncomm.kernels.launcher import _c_entry


@triton.jit(do_not_specialize=["k"])
def _axpb_kernel(x_ptr, out_ptr, n, a, k, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0):
    """``out[i] = x[i] * a + k + SHIFT`` for ``i < n``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m)
    tl.store(out_ptr + i, (x.to(tl.float32) * a + k + SHIFT).to(x.dtype), mask=m)


#: (dtype, element offset of x and out, n, a, k, kwargs): calls that differ in what Triton specialises
#: on (dtype, 16-byte alignment, n == 1, n % 16, the do-not-specialize k) and in constexprs.
CASES = [
    (torch.float32, 0, 1000, 2.0, 1, {"BLOCK": 256}),
    (torch.float32, 0, 1000, 2.0, 1, {"BLOCK": 256}),  # the same signature again
    (torch.float32, 1, 1000, 2.0, 16, {"BLOCK": 256}),  # misaligned pointers
    (torch.float32, 0, 1, 0.5, 3, {"BLOCK": 256}),  # n == 1 compiles as a constant
    (torch.float32, 0, 1024, 0.5, 3, {"BLOCK": 256}),  # n % 16 == 0
    (torch.bfloat16, 0, 1000, 2.0, 0, {"BLOCK": 256}),  # exact in bf16: no rounding to compare
    (torch.float32, 0, 1000, 2.0, 1, {"BLOCK": 256, "SHIFT": 4}),
    (torch.float32, 0, 1000, 2.0, 1, {"BLOCK": 128, "num_warps": 2}),
    (torch.float32, 1, 1000, 2.0, 1, {"BLOCK": 256}),  # back to a signature seen before
]


def _launcher_job(ctx, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(7)
    run = Launcher(_axpb_kernel, (8,))
    bad, same, direct = [], [], []
    for r in range(rounds):
        run.direct = r != 1  # the second round through Triton's wrapper around the C entry point
        for i, (dtype, off, n, a, k, kw) in enumerate(CASES):
            x = torch.randn(2048, generator=gen).to(dtype).to(ctx.device)[off:]
            out = torch.full((2048,), float("nan"), dtype=dtype, device=ctx.device)[off:]
            run(x, out, n, a, k, **kw)
            want = (x[:n].float() * a + k + kw.get("SHIFT", 0)).to(dtype)
            if not (torch.equal(out[:n], want) and out[n:n + 8].isnan().all()):
                bad.append((r, i))
            if r == rounds - 1 and run.fast:  # the kernel Triton picks for these arguments
                picked = _axpb_kernel[(8,)](x, out, n, a, k, **kw)
                same.append(run.compiled(x, out, n, a, k, **kw) is picked)
                direct.append(_c_entry(picked) is not None)  # the short path calls its C entry point
    x = torch.randn(1000, generator=gen).to(ctx.device)
    out = torch.empty_like(x)
    short = run.short_launches
    run(x, out, 1000, 2.0, k=5, BLOCK=256)  # a runtime parameter by keyword: Triton's path, still right
    kw_ok = torch.equal(out, x * 2.0 + 5) and run.short_launches == short
    return {"fast": run.fast, "short": short, "bad": bad, "same": same, "direct": direct, "kw_ok": kw_ok}


def test_launcher_matches_triton(worlds) -> None:
    w = worlds(1)
    r = w.run(_launcher_job, 3)[0]
    assert r["bad"] == [] and r["kw_ok"]
    if w.backend == "cpu":  # the interpreter: Triton's path every time
        assert (r["fast"], r["short"]) == (False, 0)
    else:
        assert r["fast"] and r["same"] == [True] * len(CASES) and r["direct"] == [True] * len(CASES)
        assert r["short"] == 3 * len(CASES) - 9  # 1 + 8 distinct signatures went through Triton


def test_launcher_rejects_bad_grids() -> None:
    for grid in (4, (), (1, 2, 3, 4), (1.5,)):
        with pytest.raises(TypeError, match="grid"):
            Launcher(_axpb_kernel, grid)
