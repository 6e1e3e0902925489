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
    return {"fast": run.fast, "short": short, "bad": bad, "same": same, "direct": direct, "kw_ok": kw_ok,
            "refused": run.refused}


def test_launcher_matches_triton(worlds) -> None:
    w = worlds(1)
    r = w.run(_launcher_job, 3)[0]
    assert r["bad"] == [] and r["kw_ok"]
    if w.backend == "cpu":  # the interpreter: Triton's path every time
        assert (r["fast"], r["short"]) == (False, 0)
    else:
        assert r["fast"] and r["same"] == [True] * len(CASES) and r["direct"] == [True] * len(CASES)
        assert r["refused"] == 0  # Triton's C entry took every direct call (none fell back to its wrapper)
        assert r["short"] == 3 * len(CASES) - 9  # 1 + 8 distinct signatures went through Triton


def test_launcher_rejects_bad_grids() -> None:
    for grid in (4, (), (1, 2, 3, 4), (1.5,)):
        with pytest.raises(TypeError, match="grid"):
            Launcher(_axpb_kernel, grid)


#: What each entry (``launcher.ABIS``) takes, as Triton's own CUDA wrapper calls it.
WRAPPER_CALLS = {
    "args": ["gridX", "gridY", "gridZ", "stream", "function", "self.launch_cooperative_grid", "self.launch_pdl",
             "global_scratch", "profile_scratch", "*args"],
    "tuple": ["gridX", "gridY", "gridZ", "stream", "function", "self.launch_cooperative_grid", "self.launch_pdl",
              "kernel_metadata", "launch_metadata", "launch_enter_hook", "launch_exit_hook", "global_scratch",
              "profile_scratch", "self.arg_annotations", "self.kernel_signature", "args"],
}


def _wrapper_call() -> list[str]:
    """The arguments of ``self.launch(...)`` in this Triton's ``CudaLauncher.__call__``, read from its
    source (no GPU needed)."""
    import ast
    import inspect

    from triton.backends.nvidia import driver as nvidia_driver

    tree = ast.parse(inspect.getsource(nvidia_driver.CudaLauncher))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.launch")
    return [ast.unparse(a) for a in call.args]


def test_this_triton_has_the_launch_entry_the_launcher_calls() -> None:
    """The installed Triton's release is in ``ABIS`` and its own wrapper calls the C entry the way the
    short path does (the last argument may be renamed: 3.8 and 3.9 call it ``kernel_args``)."""
    from tritoncomm.kernels import launcher

    assert launcher.ABI is not None, f"triton {triton.__version__} is not in launcher.ABIS"
    got, want = _wrapper_call(), WRAPPER_CALLS[launcher.ABI]
    assert got[:-1] == want[:-1] and got[-1] in (want[-1], "kernel_args"), (triton.__version__, got)


def test_releases_read_and_unknown_ones_take_tritons_path() -> None:
    from tritoncomm.kernels import launcher

    assert launcher.triton_release("3.8.0") == (3, 8)
    assert launcher.triton_release("3.9.0+git1a2b") == (3, 9)
    assert launcher.triton_release("3.10.0rc1") == (3, 10)
    assert launcher.triton_release("nightly") == (0, 0)
    assert launcher.ABIS.get((3, 10)) is None and launcher.ABIS[(3, 6)] == "args"

    class _Run:  # a compiled kernel's wrapper as each release builds it
        launch = print  # any builtin
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False
        arg_annotations, kernel_signature = (), b""

    class _Kernel:
        run = _Run()

    assert launcher._c_entry(_Kernel(), "tuple")[3] == ((), b"")
    assert launcher._c_entry(_Kernel(), "args") is None  # a 3.7+ wrapper with 3.6's entry: the wrapper
    assert launcher._c_entry(_Kernel(), None) is None  # an unknown release
    _Run.gsan_enabled = True
    assert launcher._c_entry(_Kernel(), "tuple") is None  # GSan adds arguments
