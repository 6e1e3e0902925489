"""SGLang: tritoncomm in SGLang's custom all-reduce slot and its fused add-RMSNorm, by a plugin.

SGLang's ``GroupCoordinator`` builds its custom all-reduce as
``dispatch_custom_allreduce(group=cpu_group, device=device)(group=cpu_group, device=device)`` and asks
it first for the out-of-place all-reduce (method ``"ca"``) and around CUDA-graph capture
(``ca_comm.capture()``), except that where FlashInfer's all-reduce fusion is on (SGLang turns it on
by itself for several model families on sm90/sm100) its ``all_reduce`` asks FlashInfer's standalone
all-reduce first (``GroupCoordinator._can_use_flashinfer_allreduce``). Its RMSNorm with a residual,
under tensor parallelism on CUDA, first calls ``flashinfer_allreduce_residual_rmsnorm``
(``layers/flashinfer_comm_fusion.py``), which returns ``(norm, new residual)`` or ``(None, None)`` to
decline.

The plugin (entry point ``sglang.srt.plugins``, run by SGLang's ``load_plugins`` in every process)
registers, when ``TRITONCOMM_ENABLE=1``, three hooks with SGLang's ``HookRegistry``:

* on ``dispatch_custom_allreduce``: the class it returns builds ``SGLangCustomAllreduce``, and the
  class SGLang would have used where tritoncomm cannot serve the group;
* on ``GroupCoordinator._can_use_flashinfer_allreduce``: False for a group whose ``ca_comm`` is
  tritoncomm's (and enabled), so that SGLang's all-reduce reaches its custom all-reduce slot; sizes
  the slot declines take SGLang's remaining path, not FlashInfer's;
* on ``flashinfer_allreduce_residual_rmsnorm`` (unless ``TRITONCOMM_FUSION=0``): where the fusion
  group's ``ca_comm`` is tritoncomm's, tritoncomm's fused all-reduce + add + RMSNorm serves it, or
  declines with ``(None, None)`` for shapes it does not serve; elsewhere FlashInfer's runs. In
  deterministic inference (``SGLANG_ENABLE_DETERMINISTIC_INFERENCE``) its rows are batch-invariant, at
  every token count (past the fused op's size: the all-reduce, then ``invariant_add_rms_norm``).

All are AROUND hooks (a REPLACE that keeps the original at hand), so SGLang's own code serves
whatever tritoncomm does not. Written against SGLang 0.5.23, whose own code the tests run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import ProcessGroup

from ..config import CommConfig
from .custom_allreduce import FUSED_RESERVE_BYTES, CustomAllReduceSlot
from .switch import ENABLE_ENV, enabled, fusion_enabled

__all__ = ["DISPATCH_TARGET", "FI_FIRST_TARGET", "FUSED_NORM_TARGET", "SGLangCustomAllreduce", "plugin"]

log = logging.getLogger("sglang.srt.plugins.tritoncomm")

#: What the plugin hooks, as SGLang's ``HookRegistry`` names targets.
DISPATCH_TARGET = "sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce"
FUSED_NORM_TARGET = "sglang.srt.layers.flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm"
FI_FIRST_TARGET = "sglang.srt.distributed.parallel_state.GroupCoordinator._can_use_flashinfer_allreduce"


def _deterministic() -> bool:
    """SGLang's deterministic collectives (``GroupCoordinator._deterministic_collectives_enabled``)."""
    try:
        from sglang.srt.environ import envs
    except ImportError:
        return False
    if envs.SGLANG_USE_1STAGE_ALLREDUCE.is_set():
        return bool(envs.SGLANG_USE_1STAGE_ALLREDUCE.get())
    return bool(envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get())


def plugin() -> None:
    """SGLang's general plugin: registers the hooks (module docstring) when ``TRITONCOMM_ENABLE=1``.
    Logs one line saying whether it took over, and why not."""
    if not enabled():
        log.info("tritoncomm: installed, inactive (set %s=1 to serve SGLang's TP all-reduce)", ENABLE_ENV)
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as exc:  # SGLang absent, or one without the hook registry (before 0.5.23)
        log.warning("tritoncomm: not serving SGLang: its plugin hooks cannot be imported (%s)", exc)
        return

    HookRegistry.register(DISPATCH_TARGET, _dispatch, HookType.AROUND)
    HookRegistry.register(FI_FIRST_TARGET, _flashinfer_steps_aside, HookType.AROUND)
    fused = "fused add-RMSNorm off (TRITONCOMM_FUSION=0)"
    if fusion_enabled():
        HookRegistry.register(FUSED_NORM_TARGET, _fused_norm, HookType.AROUND)
        fused = "fused all-reduce + add-RMSNorm served"
        if _deterministic():
            fused += " (deterministic inference: batch-invariant rows at every token count)"
    log.info("tritoncomm: serving SGLang's custom all-reduce slot (TP all-reduce, graph capture); %s", fused)


class SGLangCustomAllreduce(CustomAllReduceSlot):
    """SGLang 0.5.23's ``CustomAllreduce`` contract (``group``, ``device``, ``max_size``), served by
    tritoncomm; SGLang asks its slot for all-reduces only, so no all-gather or reduce-scatter is set up."""

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, max_size: int = 8192 * 1024, *,
                 config: CommConfig | None = None) -> None:
        super().__init__(group, device, max_size=max_size, max_all_gather_size=0, max_reduce_scatter_size=0,
                         config=config, invariant_norm=_deterministic())


def _dispatch(original: Callable[..., Any], group: ProcessGroup, device: torch.device) -> Callable[..., Any]:
    """AROUND ``dispatch_custom_allreduce``: a class-like builder of ``SGLangCustomAllreduce`` that
    builds SGLang's own choice instead where tritoncomm declines the group."""

    def build(group: ProcessGroup, device: torch.device, **kwargs: Any) -> Any:
        ca = SGLangCustomAllreduce(group, device, **kwargs)
        if not ca.disabled:
            return ca
        fallback = original(group=group, device=device)
        log.warning("tritoncomm: not serving this group; SGLang's %s does",
                    getattr(fallback, "__name__", type(fallback).__name__))
        return fallback(group=group, device=device, **kwargs)

    return build


def _flashinfer_steps_aside(original: Callable[..., Any], coordinator: Any, input_: torch.Tensor) -> bool:
    """SGLang's question "does FlashInfer's standalone all-reduce take this?": SGLang's answer, except
    no where the group's custom all-reduce slot is tritoncomm's and serves ``input_`` (the same answer
    on every rank). SGLang's answer comes first, so configurations where FlashInfer is off never reach
    the slot's size check (a guard on the token count under torch.compile)."""
    if not original(coordinator, input_):
        return False
    ca = coordinator.ca_comm
    return not (isinstance(ca, SGLangCustomAllreduce) and ca.should_custom_ar(input_))


def _fused_norm(original: Callable[..., Any], input_tensor: torch.Tensor, residual: torch.Tensor,
                weight: torch.Tensor, eps: float = 1e-6, max_token_num: int = 2048, use_oneshot: bool | None = None,
                trigger_completion_at_end: bool = False, fp32_acc: bool = True,
                use_attn_tp_group: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """AROUND ``flashinfer_allreduce_residual_rmsnorm``: ``(norm, residual + all_reduce(x))`` from
    tritoncomm when the fusion group is tritoncomm's, ``(None, None)`` (SGLang's "not handled") for
    what it does not serve there, FlashInfer's answer elsewhere. The first call for a hidden size sets
    the fused op up (collective, outside graph capture), as FlashInfer's workspace is set up there."""
    if use_attn_tp_group:  # the attention TP group, as SGLang's resolve_fusion_group names it
        from sglang.srt.runtime_context import get_parallel

        coord = get_parallel().attn_tp_group
    else:
        from sglang.srt.layers.flashinfer_comm_fusion import resolve_fusion_group

        coord = resolve_fusion_group(use_attn_tp_group=False)[2]
    ca = getattr(coord, "ca_comm", None)
    if not isinstance(ca, CustomAllReduceSlot) or ca.disabled:
        return original(input_tensor, residual, weight, eps=eps, max_token_num=max_token_num,
                        use_oneshot=use_oneshot, trigger_completion_at_end=trigger_completion_at_end,
                        fp32_acc=fp32_acc, use_attn_tp_group=use_attn_tp_group)
    if input_tensor.dim() != 2 or input_tensor.dtype not in (torch.bfloat16, torch.float16):
        return None, None
    hidden = input_tensor.shape[1]
    f = ca.fused
    if f is None or f.max_hidden < hidden or f.max_tokens < input_tensor.shape[0]:
        capturing = input_tensor.is_cuda and torch.cuda.is_current_stream_capturing()
        tokens = min(max(max_token_num, input_tensor.shape[0]), max(1, FUSED_RESERVE_BYTES // (2 * hidden)))
        if capturing:  # no set-up inside a capture; a set-up op may still serve the rows batch-invariantly
            if f is None or f.max_hidden < hidden:
                return None, None
        elif not ca.setup_fused_norm(tokens, hidden):
            return None, None
    if ca.should_fused_norm(input_tensor, residual, weight):
        return ca.fused_add_rms_norm(input_tensor, residual, weight, eps)
    if ca.should_invariant_norm(input_tensor, residual, weight):  # deterministic inference, past the fused size
        return ca.invariant_add_rms_norm(input_tensor, residual, weight, eps)
    return None, None
