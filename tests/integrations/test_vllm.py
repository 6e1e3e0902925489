"""vLLM 0.33.0's own code driving tritoncomm in the CPU world.

The ranks import vLLM's Python files (``engines.py``), load plugins with vLLM's loader, and build
their groups with vLLM's ``init_distributed_environment`` / ``initialize_model_parallel``. The CPU
platform is pointed at vLLM's CUDA communicator (``get_device_communicator_cls``) and, as vLLM's
CUDA platform does, at its custom-op collectives; nothing else of vLLM is replaced.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from .enginesetup import vllm_up
from .enginetest import Spy, gathered, module_world, rank_order_sum, started_runs
from .rankchecks import check_vllm_fusion, check_vllm_sequence_parallel, vllm_fusion, vllm_sequence_parallel

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
vw = module_world(vllm_up, "vw")  # two ranks, the engine set up by ``vllm_up``


def _ca():
    import vllm.distributed.parallel_state as ps

    return ps.get_tp_group().device_communicator.ca_comm


# -- the plugin, through vLLM's loader ---------------------------------------------------------------
_LOAD = """
import os, sys
if os.environ.get("BREAK_PASS_MANAGER") == "1":  # as where vLLM's compiled attention kernels do not load
    sys.modules["vllm.compilation.passes.pass_manager"] = None
if os.environ.get("BREAK_PASS_MANAGER") == "op":  # as where vLLM's extension lacks an op its import reads
    import importlib.abc, importlib.machinery

    class NoOp(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            return importlib.machinery.ModuleSpec(name, self) if name.endswith("passes.pass_manager") else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise AttributeError("'_OpNamespace' '_C' object has no attribute 'rotary_embedding'")

    sys.meta_path.insert(0, NoOp())
import vllm.plugins
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
import vllm.distributed.device_communicators.custom_all_reduce as car
import vllm.distributed.device_communicators.flashinfer_all_reduce as fi
configure_logging(LoggingConfig())  # as vLLM's processes do before they load plugins
original, fi_original = car.CustomAllreduce, fi.FlashInferAllReduce
vllm.plugins.load_general_plugins()
replaced = car.CustomAllreduce is not original
print("REPLACED", replaced, replaced and issubclass(car.CustomAllreduce, original))
fi_replaced = fi.FlashInferAllReduce is not fi_original
print("FI", fi_replaced, fi_replaced and issubclass(fi.FlashInferAllReduce, fi_original))
try:
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    print("PASS", getattr(PostGradPassManager.configure, "tritoncomm", False))
except (ImportError, AttributeError):
    print("PASS", False)
"""


#: id -> (environment, vLLM's all-reduce classes replaced, fusion pass installed, the plugin's line)
_LOADS = {
    "off": ({"TRITONCOMM_ENABLE": ""}, False, False, "installed, inactive"),
    "on": ({}, True, True, "serving vLLM's custom all-reduce slot"),
    "batch-invariant": ({"VLLM_BATCH_INVARIANT": "1"}, True, True, "slot in batch-invariant mode (TP all-reduce at "
                        "every size"),
    "no-fusion": ({"TRITONCOMM_FUSION": "0"}, True, False, "TRITONCOMM_FUSION=0"),
    "agrs": ({}, True, True, "data-parallel all-gather + reduce-scatter served"),
    "no-agrs": ({"TRITONCOMM_AGRS": "0"}, True, True, "all-gather + reduce-scatter off (TRITONCOMM_AGRS=0)"),
    "no-pass-manager": ({"BREAK_PASS_MANAGER": "1"}, True, False, "pass manager does not import (ModuleNotFoundError"),
    "pass-manager-op": ({"BREAK_PASS_MANAGER": "op"}, True, False, "pass manager does not import (AttributeError"),
}
loads = started_runs(_LOAD, {case: v[0] for case, v in _LOADS.items()}, "test_plugin_through_vllm_loader", "loads")


@pytest.mark.parametrize("case", list(_LOADS))
def test_plugin_through_vllm_loader(loads, case):
    _, replaced, fusion, line = _LOADS[case]
    out = loads[case].output()
    assert f"REPLACED {replaced} {replaced}" in out, out[-3000:]
    assert f"FI {replaced} {replaced}" in out, out[-3000:]
    assert f"PASS {fusion}" in out, out[-3000:]
    assert line in out, out[-3000:]
    assert sum("tritoncomm:" in ln for ln in out.splitlines()) == 1, out[-3000:]


# -- the contract, from vLLM's own class ---------------------------------------------------------------
def _contract(ctx):
    import vllm.distributed.device_communicators.custom_all_reduce as car

    from tritoncomm.integrations.vllm import TritonCommCustomAllreduce

    served = car.CustomAllreduce
    original = served.__bases__[1]  # the served class is (ours, vLLM's)
    ours = TritonCommCustomAllreduce

    def sig(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    theirs_init, ours_init = sig(original.__init__), sig(ours.__init__)
    methods = [n for n, v in vars(original).items()
               if callable(v) and not n.startswith("_") and not isinstance(v, staticmethod)]
    missing = [n for n in methods if n not in dir(ours)]
    params = {n: ([p[0] for p in sig(getattr(original, n))], [p[0] for p in sig(getattr(ours, n))])
              for n in methods if n not in missing}
    return original.__name__, theirs_init, ours_init, missing, params, _ca().__class__ is served


def test_contract_is_vllms(vw):
    name, theirs, ours, missing, params, in_slot = vw.run(_contract)[0]
    assert name == "CustomAllreduce" and in_slot
    assert ours[:len(theirs)] == theirs, "constructor differs from vLLM's"
    assert all(p[1] == inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])
    assert not missing, f"vLLM's CustomAllreduce methods we lack: {missing}"
    for n, (t, o) in params.items():
        assert o[:len(t)] == t, f"{n}: vLLM's parameters {t}, ours {o}"


# -- TP all-reduce through vLLM's GroupCoordinator ---------------------------------------------------------------
def _all_reduce(ctx, dtype, numels):
    import vllm.distributed.parallel_state as ps

    tp, ca = ps.get_tp_group(), _ca()
    spy = Spy(ca, "custom_all_reduce")
    ok = []
    try:
        for i, n in enumerate(numels):
            for rep in range(2):  # repeated calls, fresh data
                g = torch.Generator().manual_seed(1000 * i + 10 * rep + ctx.rank)
                x = torch.randn(n, generator=g).to(dtype)
                y = tp.all_reduce(x)
                want = rank_order_sum(gathered(ctx, x), dtype)
                ok.append(torch.equal(y, want) and all(torch.equal(y, o) for o in gathered(ctx, y)))
        served = spy.calls
        big = torch.ones(ca.max_size // x.element_size(), dtype=dtype)  # vLLM's own path from max_size up
        y = tp.all_reduce(big)
        ok.append(torch.equal(y, torch.full_like(big, ctx.world)))
        return type(ca).__name__, served, spy.calls, ok
    finally:
        spy.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_tp_all_reduce_served_and_exact(vw, dtype):
    numels = [1, 7, 1000, 4099]
    for name, served, after_big, ok in vw.run(_all_reduce, dtype, numels):
        assert name == "TritonCommCustomAllreduce"
        assert served == 2 * len(numels), "vLLM did not ask tritoncomm"
        assert after_big == served, "vLLM's path past max_size went through tritoncomm"
        assert all(ok), ok


# -- sequence parallelism: vLLM's sp_all_gather / sp_reduce_scatter --------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_sequence_parallel_served(vw, dtype):
    for result in vw.run(vllm_sequence_parallel, dtype):
        check_vllm_sequence_parallel(result)


# -- graph capture: vLLM's graph_capture enters ours ---------------------------------------------------
class _Stream:
    def wait_stream(self, other: object) -> None:
        pass


def _graph_capture(ctx):
    import contextlib

    import vllm.distributed.parallel_state as ps

    tp, ca = ps.get_tp_group(), _ca()
    saved = torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream
    # the CPU world has no streams: vLLM's stream bookkeeping gets inert ones, the rest is vLLM's code
    stream = _Stream()
    torch.cuda.Stream, torch.cuda.current_stream = (lambda *a, **k: stream), (lambda *a, **k: stream)
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    try:
        before = ca._IS_CAPTURING
        with tp.graph_capture():
            inside = ca._IS_CAPTURING
            x = torch.full((64,), float(ctx.rank + 1), dtype=torch.bfloat16)
            y = tp.all_reduce(x)
        return before, inside, ca._IS_CAPTURING, torch.equal(y, torch.full_like(x, sum(range(1, ctx.world + 1))))
    finally:
        torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream = saved


def test_vllm_graph_capture_enters_ours(vw):
    for before, inside, after, ok in vw.run(_graph_capture):
        assert (before, inside, after) == (False, True, False)
        assert ok


# -- vLLM's gates: the etp group, --disable-custom-all-reduce, register_graph_buffers -----------------------
def _gates(ctx):
    import vllm.distributed.parallel_state as ps
    from vllm.config import VllmConfig

    ranks = [list(range(ctx.world))]
    x = torch.full((16,), float(ctx.rank + 1))
    total = float(sum(range(1, ctx.world + 1)))
    out = {}
    etp = ps.init_model_parallel_group(ranks, ctx.rank, "gloo", group_name="etp")
    out["etp"] = (etp.device_communicator.ca_comm, torch.equal(etp.all_reduce(x), torch.full_like(x, total)))
    etp.destroy()
    ps.set_custom_all_reduce(False)
    try:
        off = ps.init_model_parallel_group(ranks, ctx.rank, "gloo", group_name="tp")
        out["disabled"] = (off.device_communicator.ca_comm, torch.equal(off.all_reduce(x), torch.full_like(x, total)))
        off.destroy()
    finally:
        ps.set_custom_all_reduce(True)
    saved = VllmConfig.use_cumem_cudagraph_pool
    VllmConfig.use_cumem_cudagraph_pool = property(lambda self: True)  # what vLLM's sleep mode sets up
    try:
        cumem = ps.init_model_parallel_group(ranks, ctx.rank, "gloo", group_name="tp")
        ca = cumem.device_communicator.ca_comm
        out["cumem"] = (type(ca).__name__, ca._register, _ca()._register)
        cumem.destroy()
    finally:
        VllmConfig.use_cumem_cudagraph_pool = saved
    return out


def test_vllm_gates_leave_us_off(vw):
    for out in vw.run(_gates):
        assert out["etp"] == (None, True)
        assert out["disabled"] == (None, True)
        assert out["cumem"] == ("TritonCommCustomAllreduce", False, True)


# -- FlashInfer's standalone all-reduce, which vLLM's communicator asks before ca_comm ----------------------
def _flashinfer_first(ctx):
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fi
    import vllm.distributed.parallel_state as ps

    from tritoncomm.integrations.vllm import yielding_flashinfer_class

    plugins = fi.FlashInferAllReduce
    vllms = plugins.__bases__[0]

    class Available(vllms):
        """vLLM's class as it comes up where FlashInfer imports on CUDA (the CPU world's platform and
        missing FlashInfer keep it disabled here): enabled, taking every input, visibly wrong."""

        def __init__(self, group, device) -> None:
            self.disabled, self.calls = False, 0

        def should_use_fi_ar(self, input_tensor):
            return True

        def all_reduce(self, input_tensor):
            self.calls += 1
            return torch.zeros_like(input_tensor)

        def destroy(self) -> None:
            pass

    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(ctx.rank)).to(torch.bfloat16)
    want = rank_order_sum(gathered(ctx, x), x.dtype)
    big = torch.ones(1024, 4096, dtype=torch.bfloat16)  # 8 MB: at the slot's max_size, which it declines
    out = {}
    for name, cls, custom in (("vllm", Available, True), ("plugin", yielding_flashinfer_class(Available), True),
                              ("plugin, custom all-reduce off", yielding_flashinfer_class(Available), False)):
        fi.FlashInferAllReduce = cls
        ps.set_custom_all_reduce(custom)
        try:
            g = ps.init_model_parallel_group([list(range(ctx.world))], ctx.rank, "gloo", group_name="tp")
            comm = g.device_communicator
            y = g.all_reduce(x)
            small = (comm.fi_ar_comm.calls, torch.equal(y, want))
            large = (g.all_reduce(big).abs().sum().item() == 0, comm.fi_ar_comm.calls)  # FlashInfer's zeros
            out[name] = (comm.fi_ar_comm.disabled, *small, *large)
            g.destroy()
        finally:
            fi.FlashInferAllReduce = plugins
            ps.set_custom_all_reduce(True)
    return out


def test_flashinfer_all_reduce_steps_aside(vw):
    """vLLM asks FlashInfer's standalone all-reduce before its custom all-reduce slot: with FlashInfer
    available, vLLM's own order would never reach tritoncomm. The plugin's class declines what the
    slot serves and keeps what it declines (8 MB, past the slot's max_size); with custom all-reduce
    off it takes everything, as vLLM's does. (calls counts FlashInfer's all-reduces; its stand-in
    returns zeros.)"""
    for out in vw.run(_flashinfer_first):
        assert out["vllm"] == (False, 1, False, True, 2)  # vLLM's order: FlashInfer first, every size
        assert out["plugin"] == (False, 0, True, True, 1)  # tritoncomm's slot serves, exactly; 8 MB FlashInfer's
        assert out["plugin, custom all-reduce off"] == (False, 1, False, True, 2)


# -- the fused all-reduce + RMSNorm (+ FP8) pass -------------------------------------------------------
def _manager(ctx):
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.config import get_current_vllm_config

    from tritoncomm.integrations.vllm_fusion import TritonCommFusionPass

    manager = PostGradPassManager()
    manager.configure(get_current_vllm_config())
    return [(type(p).__name__, p.disabled, p.reason) for p in manager.passes if isinstance(p, TritonCommFusionPass)]


def test_pass_manager_builds_ours(vw):
    for installed in vw.run(_manager):
        # vLLM's pass manager builds ours (inactive here: the config names no model)
        assert [i[:2] for i in installed] == [("TritonCommFusionPass", True)]
        assert "hidden size" in installed[0][2]


@pytest.mark.parametrize("compiled", [False, True], ids=["fx", "inductor"])
@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "fp8"])
def test_fusion_pass_rewrites_vllm_graph(vw, quant, compiled):
    for out in vw.run(vllm_fusion, quant, compiled):
        check_vllm_fusion(out, quant, compiled)
