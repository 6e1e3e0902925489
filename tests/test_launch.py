"""The local launcher reports failures by rank and never hangs."""

from __future__ import annotations

import time

import pytest

from tritoncomm.launch import RankError

from .conftest import BACKEND, new_world


def _job_fail_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    return ctx.rank


def _job_hang(ctx):
    if ctx.rank == 0:
        time.sleep(3600)
    return ctx.rank


def _job_env(ctx):
    import os

    return {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                           "NVSHMEM_DISABLE_NVLS", "TRITON_INTERPRET")}


def test_failure_names_the_rank(worlds):
    with pytest.raises(RankError) as info:
        worlds(2).run(_job_fail_on_rank1)
    assert info.value.failures.keys() == {1}
    assert "boom on rank 1" in str(info.value)
    assert worlds(2).run(_job_env)[0]["NCCL_NVLS_ENABLE"] == "0"  # the world is still usable


def test_hung_job_times_out_and_kills_the_world():
    with new_world(2) as w:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="rank"):
            w.run(_job_hang, timeout=5)
        assert time.monotonic() - t0 < 30
        assert not w.alive


def test_ranks_have_multicast_off(worlds):
    for env in worlds(2).run(_job_env):
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["TRITON_INTERPRET"] == ("1" if BACKEND == "cpu" else "0")


def test_torchrun_launches_the_cpu_world(tmp_path):
    import os
    import subprocess
    import sys

    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():  # e.g. a GPU image's own Python: Triton 3.6 with NumPy 2.4
        pytest.skip(numpy_problem())

    from tritoncomm.launch import _free_port

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)  # keep a carried Triton
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(_free_port()), os.path.join(root, "examples", "torchrun_allreduce.py")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("matches torch.distributed") == 2


def test_the_cpu_world_names_the_numpy_its_triton_needs():
    """Only Triton 3.6's interpreter fails with NumPy 2.4 (it calls ``int()`` on 1-element arrays):
    the CPU world says so, with the fix, before any rank starts."""
    from tritoncomm.kernels.interpreter import numpy_problem

    assert "numpy<2.4" in numpy_problem("3.6.0", "2.4.6")
    assert numpy_problem("3.6.0", "2.3.5") is None
    assert numpy_problem("3.8.0", "2.4.6") is None and numpy_problem("3.7.1", "2.5.0") is None


def test_byte_sizes_round_trip():
    from tritoncomm.units import format_bytes, parse_size

    for n in (1, 3000, 2048, 100000, 1 << 20, 3 << 20, 128 << 20):
        assert parse_size(format_bytes(n)) == n
        assert parse_size(format_bytes(n, sep=" ", suffix="B").replace(" ", "")) == n
    assert format_bytes(2048, sep=" ", suffix="B") == "2 KB"
    assert format_bytes(3000000, sep=" ", suffix="B") == "3000000"
