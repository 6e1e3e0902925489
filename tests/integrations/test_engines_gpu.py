"""vLLM 0.33.0's and SGLang 0.5.23's own code driving tritoncomm on GPUs (``TRITONCOMM_TEST_BACKEND=cuda``).

The GPU image cannot fetch the engines: ``scripts/engines_gpu_pack.sh`` packs their Python code for it,
and ``scripts/gpu_engines.sh`` unpacks it there and runs this module. What runs is the engines'
Python on the image's torch (2.11; vLLM 0.33's wheel is built for 2.14), with two departures, both
outside the communication path:

* vLLM's CUDA platform imports its compiled extension (``vllm._C_stable_libtorch``), which does not
  load on another torch: an empty module stands in for it, so vLLM's own CUDA kernels are absent
  (the communicator path under test calls none of them);
* on ranks sharing one GPU (``TRITONCOMM_TEST_SHARED_GPUS=1``) NCCL refuses to start, so vLLM runs
  with ``VLLM_DISABLE_PYNCCL=1`` and gloo groups, and the comparisons with NCCL are skipped. On
  separate GPUs vLLM's groups use NCCL and every served all-reduce is also compared, bit for bit,
  with NCCL's (at world 2 a sum of two values does not depend on order).

Checked: the plugin (vLLM's loader) takes the ``ca_comm`` slot of vLLM's ``CudaCommunicator``; the TP
all-reduce through vLLM's ``GroupCoordinator`` is served by tritoncomm and equals the fixed-order sum
on every rank; sequence-parallel all-gather and reduce-scatter are served; vLLM's ``graph_capture``
enters ours, and a CUDA graph captured inside it replays with fresh data to the right sums; the
fusion pass rewrites graphs of vLLM's ops (``rankchecks.py``: traced, and compiled by inductor with
the pass where vLLM's pass manager puts it, which does not import here). SGLang: the plugin's hook
makes our adapter SGLang's ``ca_comm``, its TP all-reduce is served and exact, its ``graph_capture``
enters ours and a graph captured there replays correctly; its fused add-RMSNorm entry is served,
eagerly and captured in a graph.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
import torch.distributed as dist

from tritoncomm.launch import LocalWorld

from ..conftest import BACKEND, SHARED_GPUS
from . import engines
from .enginetest import Spy, gathered, host, rank_order_sum, rel_err
from .rankchecks import (
    EPS,
    check_sglang_fused,
    check_vllm_fusion,
    check_vllm_sequence_parallel,
    sglang_fused,
    sglang_inputs,
    sglang_unfused,
    vllm_fusion,
    vllm_sequence_parallel,
)
from .vllm_moe_jobs import agrs_job, kernel_job, switch_job

pytestmark = pytest.mark.skipif(BACKEND != "cuda", reason="GPU only (the CPU world runs test_vllm.py, test_sglang.py)")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_RANK_STATE: dict = {}  # inside a rank: what lives as long as the rank process
#: A rank still setting up the engine after this many seconds prints its stack and exits.
SETUP_S = 150


def _world(up) -> LocalWorld:
    paths = engines.paths()
    if paths is None:
        pytest.skip("the engines' code is not here: carry the pack of scripts/engines_gpu_pack.sh")
    env = {"HF_HUB_OFFLINE": "1", "TRITONCOMM_ENABLE": "1"}
    if SHARED_GPUS:
        env["VLLM_DISABLE_PYNCCL"] = "1"
    if torch.cuda.device_count() < 2 and not SHARED_GPUS:
        pytest.skip("needs 2 GPUs (TRITONCOMM_TEST_SHARED_GPUS=1 shares them)")
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        w = LocalWorld(2, "cuda", env=env, shared_gpus=SHARED_GPUS, setup_timeout=300)
    finally:
        sys.path[:] = saved
    try:
        w.run(up, timeout=SETUP_S + 30)
    except BaseException:
        w.close()
        raise
    return w


def _gpu_world(up, name: str):
    """A module-scoped fixture ``name``: a two-rank GPU world on which ``up`` has run."""

    @pytest.fixture(scope="module", name=name)
    def fixture():
        w = _world(up)
        yield w
        w.close()

    return fixture


def _nccl_equal(ctx, x: torch.Tensor, y: torch.Tensor) -> bool | None:
    """Whether ``y`` equals NCCL's sum of ``x`` (None on shared GPUs, where NCCL cannot run)."""
    if SHARED_GPUS:
        return None
    ref = x.clone()
    dist.all_reduce(ref, group=_RANK_STATE["nccl"])
    return torch.equal(host(ref), host(y))


def _nccl_group() -> None:
    if not SHARED_GPUS:
        _RANK_STATE["nccl"] = dist.new_group(backend="nccl")


# -- vLLM -----------------------------------------------------------------------------------------------
def _stack_if_stuck() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(SETUP_S, exit=True)


def _stack_timer_off() -> None:
    import faulthandler

    faulthandler.cancel_dump_traceback_later()


def _vllm_up(ctx) -> None:
    """vLLM's plugin loader, config and groups on this rank's GPU, once per rank process."""
    _stack_if_stuck()
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    import vllm.distributed.parallel_state as ps
    import vllm.plugins
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform

    vllm.plugins.load_general_plugins()
    scope = set_current_vllm_config(VllmConfig())
    scope.__enter__()  # for the life of the rank, as in a vLLM worker
    _RANK_STATE["scope"] = scope
    ps.init_distributed_environment(world_size=ctx.world, rank=ctx.rank, local_rank=ctx.device.index,
                                    backend="gloo" if SHARED_GPUS else "nccl", distributed_init_method=None)
    ps.initialize_model_parallel(tensor_model_parallel_size=ctx.world)
    _RANK_STATE["platform"] = type(current_platform).__name__, current_platform.is_cuda()
    _nccl_group()
    _stack_timer_off()


vg = _gpu_world(_vllm_up, "vg")


def _vllm_ca():
    import vllm.distributed.parallel_state as ps

    return ps.get_tp_group().device_communicator.ca_comm


def _vllm_all_reduce(ctx, dtype, numels):
    import vllm.distributed.parallel_state as ps

    tp, ca = ps.get_tp_group(), _vllm_ca()
    spy = Spy(ca, "custom_all_reduce")
    ok, nccl = [], []
    try:
        for i, n in enumerate(numels):
            for rep in range(2):  # repeated calls, fresh data
                x = torch.randn(n, generator=torch.Generator().manual_seed(1000 * i + 10 * rep + ctx.rank)).to(dtype)
                xd = x.to(ctx.device)
                y = tp.all_reduce(xd)
                want = rank_order_sum(gathered(ctx, x), dtype)
                yh = host(y)
                ok.append(torch.equal(yh, want) and all(torch.equal(yh, o) for o in gathered(ctx, yh)))
                nccl.append(_nccl_equal(ctx, xd, y))
        return _RANK_STATE["platform"], type(ca).__name__, spy.calls, ok, nccl
    finally:
        spy.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_vllm_tp_all_reduce_on_gpus(vg, dtype):
    numels = [1, 7, 1000, 4099, 1 << 18]
    for platform, name, served, ok, nccl in vg.run(_vllm_all_reduce, dtype, numels):
        assert platform[1], f"vLLM's platform is {platform[0]}, not CUDA"
        assert name == "TritonCommCustomAllreduce"
        assert served == 2 * len(numels), "vLLM did not ask tritoncomm"
        assert all(ok), ok
        assert all(n is None for n in nccl) if SHARED_GPUS else all(nccl), nccl


@pytest.mark.parametrize("dtype", DTYPES)
def test_vllm_sequence_parallel_on_gpus(vg, dtype):
    for result in vg.run(vllm_sequence_parallel, dtype):
        check_vllm_sequence_parallel(result)


def _graph(ctx, tp, ca, capture_into):
    """Capture ``tp.all_reduce`` of a static input in a CUDA graph inside the engine's
    ``graph_capture`` (``capture_into()`` enters it; its ``stream`` captures), then replay it
    with fresh data three times: ``(capturing before, inside, after, registrations committed, replays
    exact)``, the commit being where the outputs that captured collectives write on peers are mapped
    into them (on the engine's capture exit, once)."""
    x = torch.empty(3000, dtype=torch.bfloat16, device=ctx.device)
    graph = torch.cuda.CUDAGraph()
    before = ca._IS_CAPTURING
    commits = Spy(ca.comm.registered, "commit")
    try:
        with capture_into() as gc:
            inside = ca._IS_CAPTURING
            x.copy_(torch.ones_like(x))
            torch.cuda.synchronize(ctx.device)
            with torch.cuda.graph(graph, stream=gc.stream):
                y = tp.all_reduce(x)
    finally:
        commits.close()
    after = ca._IS_CAPTURING
    ok = []
    for rep in range(3):
        fresh = torch.randn(3000, generator=torch.Generator().manual_seed(50 * rep + ctx.rank)).to(torch.bfloat16)
        x.copy_(fresh.to(ctx.device))
        graph.replay()
        ok.append(torch.equal(host(y), rank_order_sum(gathered(ctx, fresh), torch.bfloat16)))
    return before, inside, after, commits.calls, ok


def _vllm_graph(ctx):
    import vllm.distributed.parallel_state as ps

    tp = ps.get_tp_group()
    return _graph(ctx, tp, _vllm_ca(), lambda: tp.graph_capture())


def test_vllm_graph_capture_on_gpus(vg):
    for before, inside, after, commits, ok in vg.run(_vllm_graph):
        assert (before, inside, after, commits) == (False, True, False, 1)
        assert all(ok), ok


@pytest.mark.parametrize("compiled", [False, True], ids=["fx", "inductor"])
@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "fp8"])
def test_vllm_fusion_pass_on_gpus(vg, quant, compiled):
    for out in vg.run(vllm_fusion, quant, compiled):
        check_vllm_fusion(out, quant, compiled)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_vllm_modular_moe_kernel_on_gpus(vg, fp8):
    """vLLM's ``FusedMoEKernel`` with ``TritonCommPrepareAndFinalize`` and vLLM's batched experts on
    GPUs, against the layer in one process (``vllm_moe_jobs.kernel_job``); vLLM's CUDA platform takes the
    combine's own buffer for the experts' output there."""
    for errs, refused, aliased in vg.run(kernel_job, fp8):
        assert max(errs) < (0.08 if fp8 else 0.02), errs
        assert refused and aliased


def _stub_vllm_extension(ctx) -> None:
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))


vep = _gpu_world(_stub_vllm_extension, "vep")  # its job builds vLLM's data + expert parallel groups


def test_vllm_chooses_tritoncomm_moe_on_gpus(vep):
    """``TRITONCOMM_MOE=1`` on GPUs (``vllm_moe_jobs.switch_job``): in a data + expert parallel
    deployment vLLM's own selection picks batched experts (``BATCHED_TRITON``), its oracles build
    kernels on tritoncomm's prepare/finalize, two layers share an instance, outputs match the layer
    in one process (bf16, then FP8 blocks); vLLM's destroy closes the instances."""
    for fp8 in (False, True):
        for ours, built, shared, errs, others, left, picked, refused in vep.run(switch_job, fp8):
            assert ours and built and shared and picked == "BATCHED_TRITON" and all(refused), \
                (ours, built, shared, picked, refused)
            assert max(errs) < (0.08 if fp8 else 0.02), errs
            assert others == (False, False) and left == 0, (others, left)


def test_vllm_default_all_gather_reduce_scatter_on_gpus(vep):
    """vLLM's default expert-parallel path (its all-gather + reduce-scatter manager) on GPUs: the
    data-parallel group's ``all_gatherv`` / ``reduce_scatterv`` served by tritoncomm, exactly
    (``vllm_moe_jobs.agrs_job``)."""
    for served, calls, ok, _ in vep.run(agrs_job):
        assert served and calls == [5, 5], calls  # four through vLLM, one past the bound
        assert all(all(o) for o in ok), ok


# -- SGLang ---------------------------------------------------------------------------------------------
def _sglang_up(ctx) -> None:
    """SGLang's plugin loader and its TP group on this rank's GPU, once per rank process."""
    import logging

    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_parallel

    _stack_if_stuck()
    logging.basicConfig(level=logging.INFO)
    load_plugins()
    tp = ps.init_model_parallel_group([list(range(ctx.world))], ctx.device.index,  # local rank: the GPU
                                      "gloo" if SHARED_GPUS else "nccl", use_pynccl=False, group_name="tp")
    get_parallel().override_permanently(tp_group=tp, attn_tp_group=tp, tp_size=ctx.world, attn_tp_size=ctx.world,
                                        tp_rank=ctx.rank, attn_tp_rank=ctx.rank)
    _RANK_STATE["sglang_tp"] = tp
    _nccl_group()
    _stack_timer_off()


sg = _gpu_world(_sglang_up, "sg")


def _sglang_all_reduce(ctx, dtype):
    tp = _RANK_STATE["sglang_tp"]
    spy = Spy(tp.ca_comm, "custom_all_reduce")
    ok, nccl = [], []
    try:
        for i, n in enumerate([1, 7, 1000, 4099, 1 << 18]):
            x = torch.randn(n, generator=torch.Generator().manual_seed(100 * i + ctx.rank)).to(dtype)
            xd = x.to(ctx.device)
            y = tp.all_reduce(xd)
            ok.append(torch.equal(host(y), rank_order_sum(gathered(ctx, x), dtype)))
            nccl.append(_nccl_equal(ctx, xd, y))
        return f"{type(tp.ca_comm).__module__}.{type(tp.ca_comm).__name__}", spy.calls, ok, nccl
    finally:
        spy.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sglang_tp_all_reduce_on_gpus(sg, dtype):
    for name, served, ok, nccl in sg.run(_sglang_all_reduce, dtype):
        assert name == "tritoncomm.integrations.sglang.SGLangCustomAllreduce"
        assert served == len(ok), "SGLang did not ask tritoncomm"
        assert all(ok), ok
        assert all(n is None for n in nccl) if SHARED_GPUS else all(nccl), nccl


def _sglang_graph(ctx):
    tp = _RANK_STATE["sglang_tp"]
    return _graph(ctx, tp, tp.ca_comm, lambda: tp.graph_capture())


def test_sglang_graph_capture_on_gpus(sg):
    for before, inside, after, commits, ok in sg.run(_sglang_graph):
        assert (before, inside, after, commits) == (False, True, False, 1)
        assert all(ok), ok


@pytest.mark.parametrize("tokens, hidden, dtype", [(5, 96, torch.bfloat16), (5, 96, torch.float16),
                                                  (7, 8192, torch.bfloat16)])
def test_sglang_fused_norm_on_gpus(sg, tokens, hidden, dtype):
    for results in sg.run(sglang_fused, tokens, hidden, dtype):
        check_sglang_fused(results, dtype)


def _sglang_fused_graph(ctx):
    """SGLang's fused entry captured in a CUDA graph inside its ``graph_capture`` (after an eager
    call, as SGLang's warm-up runs before capture), replayed with fresh data: per replay
    ``(residual exact, norm's relative error)``."""
    import sglang.srt.layers.flashinfer_comm_fusion as fc

    tp = _RANK_STATE["sglang_tp"]
    tokens, hidden, dtype = 4, 1024, torch.bfloat16
    x, residual, weight = (t.to(ctx.device) for t in sglang_inputs(ctx, tokens, hidden, dtype, 0))

    def fused():
        return fc.flashinfer_allreduce_residual_rmsnorm(input_tensor=x, residual=residual, weight=weight, eps=EPS,
                                                        max_token_num=64)

    fused()
    torch.cuda.synchronize(ctx.device)
    graph = torch.cuda.CUDAGraph()
    with tp.graph_capture() as gc, torch.cuda.graph(graph, stream=gc.stream):
        norm, res = fused()
    out = []
    for rep in range(1, 4):
        fresh, res_in, w = sglang_inputs(ctx, tokens, hidden, dtype, rep)
        x.copy_(fresh.to(ctx.device))
        graph.replay()
        want, want_res = sglang_unfused(ctx, fresh, res_in, w, dtype)
        out.append((torch.equal(host(res), want_res), rel_err(host(norm), want)))
    return out


def test_sglang_fused_norm_graph_on_gpus(sg):
    for replays in sg.run(_sglang_fused_graph):
        assert all(exact and err <= 2 ** -7 for exact, err in replays), replays


def test_pack_is_the_pinned_engines():
    """The carried pack holds the pinned versions (a stale pack would test other code)."""
    paths = engines.paths()
    if paths is None:
        pytest.skip("the engines' code is not here")
    pins = {ln.split("==")[0]: ln.split("==")[1] for ln in engines.pins(engines.REQUIREMENTS)}
    found = dict(d.removesuffix(".dist-info").split("-", 1) for d in os.listdir(paths[0]) if d.endswith(".dist-info"))
    assert found == pins
