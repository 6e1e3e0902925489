"""SGLang 0.5.23's own code driving tritoncomm in the CPU world.

The ranks import SGLang's Python files (``engines.py``), load plugins with SGLang's loader (which
applies the hooks) and build a tensor-parallel ``GroupCoordinator`` with SGLang's
``init_model_parallel_group``. SGLang's ``all_reduce`` sends CPU tensors straight to
torch.distributed, and its ops are registered for CUDA tensors only, so the tests enter its dispatch
where that op's body does for CUDA tensors: ``GroupCoordinator._all_reduce_out_place(x, "auto")``. SGLang's
``layers/layernorm.py`` imports torchvision (absent here); its fused path is entered where that
module calls it, ``flashinfer_allreduce_residual_rmsnorm``.
"""

from __future__ import annotations

import pytest
import torch

from .enginesetup import sglang_tp, sglang_up
from .enginetest import Spy, gathered, module_world, rank_order_sum, started_runs
from .rankchecks import check_sglang_fused, sglang_fused

sw = module_world(sglang_up, "sw")  # two ranks, the engine set up by ``sglang_up``


# -- the plugin, through SGLang's loader -------------------------------------------------------------
_LOAD = """
import logging
logging.basicConfig(level=logging.INFO)  # as SGLang's processes configure logging before loading plugins
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from tritoncomm.integrations.sglang import DISPATCH_TARGET, FI_FIRST_TARGET, FUSED_NORM_TARGET
load_plugins()
print("HOOKED", DISPATCH_TARGET in HookRegistry._patched, FUSED_NORM_TARGET in HookRegistry._patched,
      FI_FIRST_TARGET in HookRegistry._patched)
"""


#: id -> (environment, the dispatch hooked, the fused norm hooked, the plugin's line)
_LOADS = {
    "off": ({"TRITONCOMM_ENABLE": ""}, False, False, "installed, inactive"),
    "on": ({}, True, True, "serving SGLang's custom all-reduce slot"),
    "no-fusion": ({"TRITONCOMM_FUSION": "0"}, True, False, "TRITONCOMM_FUSION=0"),
    "deterministic": ({"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"}, True, True,
                      "deterministic inference: batch-invariant rows"),
}
loads = started_runs(_LOAD, {case: v[0] for case, v in _LOADS.items()}, "test_plugin_through_sglang_loader",
                     "loads")


@pytest.mark.parametrize("case", list(_LOADS))
def test_plugin_through_sglang_loader(loads, case):
    _, dispatch, fused, line = _LOADS[case]
    out = loads[case].output()
    assert f"HOOKED {dispatch} {fused} {dispatch}" in out, out[-3000:]
    assert line in out, out[-3000:]
    assert sum("tritoncomm:" in ln for ln in out.splitlines()) == 1, out[-3000:]


# -- the contract, from SGLang's own class ------------------------------------------------------------
def _contract(ctx):
    import inspect

    from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce

    from tritoncomm.integrations.sglang import SGLangCustomAllreduce

    def sig(f):
        return [(p.name, p.kind) for p in inspect.signature(f).parameters.values()]

    def names(cls, n):
        return [p[0] for p in sig(getattr(cls, n))]

    called = ("should_custom_ar", "custom_all_reduce", "capture", "close", "register_graph_buffers")
    return (sig(CustomAllreduce.__init__), sig(SGLangCustomAllreduce.__init__),
            {n: (names(CustomAllreduce, n), names(SGLangCustomAllreduce, n)) for n in called},
            type(sglang_tp().ca_comm).__name__)


def test_contract_is_sglangs(sw):
    theirs, ours, methods, in_slot = sw.run(_contract)[0]
    assert in_slot == "SGLangCustomAllreduce"
    assert ours[:len(theirs)] == theirs
    for n, (t, o) in methods.items():
        assert o[:len(t)] == t, f"{n}: SGLang's {t}, ours {o}"


# -- TP all-reduce through SGLang's dispatch ----------------------------------------------------------
def _all_reduce(ctx, dtype):
    tp = sglang_tp()
    spy = Spy(tp.ca_comm, "custom_all_reduce")
    try:
        ok = []
        for n in (1, 7, 1000, 4099):
            for rep in range(2):
                g = torch.Generator().manual_seed(31 * n + rep + 1000 * ctx.rank)
                x = torch.randn(n, generator=g).to(dtype)
                method = tp._resolve_outplace_all_reduce_method(x)
                y = tp._all_reduce_out_place(x, "auto")
                ok.append((method, torch.equal(y, rank_order_sum(gathered(ctx, x), dtype))))
        return ok, spy.calls
    finally:
        spy.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_tp_all_reduce_served_and_exact(sw, dtype):
    for ok, calls in sw.run(_all_reduce, dtype):
        assert all(m == "ca" for m, _ in ok), ok
        assert all(e for _, e in ok), ok
        assert calls == len(ok)


# -- FlashInfer's standalone all-reduce, which SGLang asks first where its fusion is on ------------------
def _flashinfer_first(ctx):
    import sglang.srt.layers.flashinfer_comm_fusion as fcf

    tp = sglang_tp()
    x = torch.randn(4, 96).to(torch.bfloat16)
    big = torch.empty(1024, 4096, dtype=torch.bfloat16)  # 8 MB: at the slot's max_size, which it declines
    saved = fcf.can_use_flashinfer_allreduce, tp._fi_workspace_hint, tp.ca_comm
    # as on CUDA with the fusion on: FlashInfer imported, its workspace rendezvoused on this group, the
    # group tagged by SGLang's _tag_groups_for_flashinfer_allreduce_only
    fcf.can_use_flashinfer_allreduce = lambda *args, **kwargs: True
    tp._fi_workspace_hint = "attn_tp"
    try:
        ours = tp._can_use_flashinfer_allreduce(x), tp._can_use_flashinfer_allreduce(big)
        tp._fi_workspace_hint = None  # FlashInfer off: SGLang's answer, whatever the slot serves
        off = tp._can_use_flashinfer_allreduce(x)
        tp._fi_workspace_hint = "attn_tp"
        tp.ca_comm = None  # a group whose slot is not tritoncomm's
        theirs = tp._can_use_flashinfer_allreduce(x)
    finally:
        fcf.can_use_flashinfer_allreduce, tp._fi_workspace_hint, tp.ca_comm = saved
    return ours, off, theirs


def test_flashinfer_all_reduce_steps_aside(sw):
    """SGLang's all_reduce asks FlashInfer's standalone all-reduce before its custom all-reduce slot
    where FlashInfer's fusion is on (auto-enabled for several model families): tritoncomm's slot would
    never be asked. With the plugin FlashInfer declines what the slot serves and keeps the rest (8 MB,
    past the slot's max_size)."""
    for ours, off, theirs in sw.run(_flashinfer_first):
        assert (ours, off, theirs) == ((False, True), False, True)


# -- graph capture: SGLang's graph_capture enters ours --------------------------------------------------
def _graph_capture(ctx):
    tp = sglang_tp()
    ca = tp.ca_comm
    before = ca._IS_CAPTURING
    with tp.graph_capture():
        inside = ca._IS_CAPTURING
    return before, inside, ca._IS_CAPTURING


def test_sglang_graph_capture_enters_ours(sw):
    for state in sw.run(_graph_capture):
        assert state == (False, True, False)


# -- fused all-reduce + add + RMSNorm -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_norm_served(sw, dtype):
    for results in sw.run(sglang_fused, 5, 96, dtype):
        check_sglang_fused(results, dtype)


def test_fused_norm_declines_what_it_does_not_serve(sw):
    # fp32 is not served by the fused kernel: SGLang's "not handled", on every rank
    for results in sw.run(sglang_fused, 3, 32, torch.float32):
        assert results == [None, None]
