"""vLLM: tritoncomm in vLLM's custom all-reduce slot, turned on by a plugin.

vLLM's CUDA communicator builds its custom all-reduce (``ca_comm``) as
``CustomAllreduce(group=cpu_group, device=device, symm_mem_enabled=..., register_graph_buffers=...)``
for the ``tp`` group only and only while custom all-reduce is enabled (no
``--disable-custom-all-reduce``). It asks it for the TP all-reduce and first for the
sequence-parallel all-gather and reduce-scatter, and enters ``ca_comm.capture()`` around CUDA-graph
capture. For the all-reduce it asks FlashInfer's standalone all-reduce (``fi_ar_comm``, on by
default wherever FlashInfer imports) before ``ca_comm``; so where the slot is tritoncomm's, the
plugin's FlashInfer class declines what the slot serves (``yielding_flashinfer_class``).

The plugin (entry point ``vllm.general_plugins``, which ``vllm.plugins.load_general_plugins`` runs
in every vLLM process) puts ``TritonCommCustomAllreduce`` in the place of vLLM's class when
``TRITONCOMM_ENABLE=1``, so vLLM's own gates decide where it serves; whatever it declines takes vLLM's
own path. In batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) vLLM asks its custom all-reduce at every
size, relying on its fixed order: the slot then serves every size (``CustomAllReduceSlot``'s
``batch_invariant``), the fusion pass below serves batch-invariant rows at every size, and the MoE
parts stay vLLM's. With compilation it also installs ``vllm_fusion.TritonCommFusionPass``, which
rewrites all-reduce + RMSNorm (+ static FP8 quant) into one tritoncomm kernel (``TRITONCOMM_FUSION=0``
leaves it out).
With ``TRITONCOMM_MOE=1`` it also has vLLM build tritoncomm's MoE prepare/finalize in data + expert
parallel deployments (``vllm_moe.install``).

Written against vLLM 0.33.0, whose own code the tests run (``tests/integrations/test_vllm.py``).
"""

from __future__ import annotations

import importlib
import logging

import torch
from torch.distributed import ProcessGroup

from .. import settings
from ..config import CommConfig
from .custom_allreduce import CustomAllReduceSlot
from .switch import AGRS_ENV, ENABLE_ENV, FUSION_ENV, MOE_ENV, agrs_enabled, enabled, fusion_enabled, moe_enabled

__all__ = ["ENABLE_ENV", "FUSION_ENV", "MOE_ENV", "TritonCommCustomAllreduce", "batch_invariant_mode", "plugin",
           "served_class", "yielding_flashinfer_class"]

_LOGGER = "vllm.tritoncomm"  # under vLLM's logger, so the line shows in vLLM's log


def plugin() -> None:
    """vLLM's general plugin. With ``TRITONCOMM_ENABLE=1`` vLLM's CUDA communicator builds
    ``TritonCommCustomAllreduce`` where it builds its own custom all-reduce, and vLLM's post-grad pass
    manager runs ``TritonCommFusionPass``; with ``TRITONCOMM_MOE=1`` too, vLLM's MoE layers in data +
    expert parallel deployments get tritoncomm's prepare/finalize. Logs one line saying whether it
    took over, and why not."""
    log = logging.getLogger(_LOGGER)
    if not enabled():
        log.info("tritoncomm: installed, inactive (set %s=1 to serve vLLM's TP communication)", ENABLE_ENV)
        return
    try:
        import vllm.distributed.device_communicators.custom_all_reduce as vllm_car
    except ImportError as e:
        log.warning("tritoncomm: not taking over: vLLM's custom all-reduce does not import (%s)", e)
        return
    invariant = batch_invariant_mode()
    if not getattr(vllm_car.CustomAllreduce, "served_by_tritoncomm", False):
        vllm_car.CustomAllreduce = served_class(vllm_car.CustomAllreduce)
    try:
        import vllm.distributed.device_communicators.flashinfer_all_reduce as vllm_fi
    except ImportError as e:  # nothing to step aside
        log.debug("tritoncomm: vLLM's FlashInfer all-reduce does not import (%s)", e)
    else:
        if not getattr(vllm_fi.FlashInferAllReduce, "yields_to_tritoncomm", False):
            vllm_fi.FlashInferAllReduce = yielding_flashinfer_class(vllm_fi.FlashInferAllReduce)
    fusion = _part("vllm_fusion", fusion_enabled(), f"fused all-reduce + RMSNorm off ({FUSION_ENV}=0)",
                   "fused all-reduce + RMSNorm off: vLLM's pass manager does not import")
    if invariant:  # what is not batch-invariant stays vLLM's (docs/engines.md, "Deterministic modes")
        log.info("tritoncomm: serving vLLM's custom all-reduce slot in batch-invariant mode (TP all-reduce at every "
                 "size, sequence-parallel all-gather and reduce-scatter, graph capture); %s (batch-invariant rows, "
                 "where vLLM compiles); data-parallel all-gather + reduce-scatter and expert-parallel all-to-all "
                 "vLLM's own", fusion)
        return
    agrs = _part("vllm_agrs", agrs_enabled(), f"data-parallel all-gather + reduce-scatter off ({AGRS_ENV}=0)",
                 "data-parallel all-gather + reduce-scatter vLLM's own")
    moe = _part("vllm_moe", moe_enabled(), f"expert-parallel all-to-all vLLM's own (set {MOE_ENV}=1 for tritoncomm's)",
                "expert-parallel all-to-all vLLM's own: its fused MoE does not import")
    log.info("tritoncomm: serving vLLM's custom all-reduce slot (TP all-reduce, sequence-parallel all-gather and "
             "reduce-scatter, graph capture); %s; %s; %s", fusion, agrs, moe)


def batch_invariant_mode() -> bool:
    """Whether vLLM runs batch-invariant (``VLLM_BATCH_INVARIANT``, read as vLLM reads it)."""
    try:
        import vllm.envs as vllm_envs
    except ImportError:
        return settings.vllm_batch_invariant()
    return bool(vllm_envs.VLLM_BATCH_INVARIANT)


def _part(module: str, on: bool, off: str, failed: str) -> str:
    """One optional part of the plugin: ``install()`` of the sibling ``module`` where ``on`` (its
    line), else ``off``; where installing raises, ``failed`` with the reason. The plugin never
    stops vLLM's start: what it cannot install stays vLLM's."""
    if not on:
        return off
    try:
        return importlib.import_module(f".{module}", __package__).install()
    except Exception as e:  # vLLM's modules import its compiled ops, which an install may lack
        return f"{failed} ({type(e).__name__}: {e})"


def served_class(base: type) -> type:
    """``TritonCommCustomAllreduce`` as a subclass of vLLM's ``CustomAllreduce`` (``base``), so that
    what vLLM reaches through the class itself (``create_shared_buffer``, ``free_shared_buffer``)
    stays vLLM's while every method vLLM calls on its ``ca_comm`` is tritoncomm's."""
    return type("TritonCommCustomAllreduce", (TritonCommCustomAllreduce, base),
                {"__module__": __name__, "__doc__": TritonCommCustomAllreduce.__doc__, "served_by_tritoncomm": True})


def yielding_flashinfer_class(base: type) -> type:
    """vLLM's ``FlashInferAllReduce`` (``base``) that declines every all-reduce its group's custom
    all-reduce slot serves where that slot is tritoncomm's (and enabled): vLLM's CUDA communicator
    asks FlashInfer's standalone all-reduce before the slot, so without this it would never reach
    tritoncomm. What the slot declines (past its ``max_size``, 8 MB by default) FlashInfer still takes,
    as in vLLM's own order, and its workspace is only set up once it does. The slot is found, on the
    first call, as the ``ca_comm`` of the vLLM group whose communicator holds this object. vLLM's fused
    all-reduce + RMSNorm pass has its own FlashInfer workspace and is not affected
    (``TritonCommFusionPass`` runs first)."""

    def should_use_fi_ar(self, input_tensor: torch.Tensor) -> bool:
        slot = self.__dict__.get("_tritoncomm_slot")
        if slot is None:
            slot = _slot_beside(self)
            if slot is not None:
                self._tritoncomm_slot = slot
        if slot and slot.should_custom_ar(input_tensor):
            return False
        return base.should_use_fi_ar(self, input_tensor)

    return type("TritonCommYieldingFlashInferAllReduce", (base,),
                {"should_use_fi_ar": should_use_fi_ar, "__module__": __name__,
                 "__doc__": yielding_flashinfer_class.__doc__, "yields_to_tritoncomm": True})


def _slot_beside(fi: object) -> CustomAllReduceSlot | bool | None:
    """The tritoncomm slot of the vLLM group whose communicator holds ``fi`` (False where that group's
    slot is not tritoncomm's or is disabled; None while no registered group holds ``fi``)."""
    from vllm.distributed import parallel_state

    for ref in list(parallel_state._groups.values()):
        comm = getattr(ref(), "device_communicator", None)
        if comm is not None and getattr(comm, "fi_ar_comm", None) is fi:
            ca = getattr(comm, "ca_comm", None)
            ours = getattr(ca, "served_by_tritoncomm", False) and not ca.disabled
            if ours:
                logging.getLogger(_LOGGER).info(
                    "tritoncomm: vLLM's FlashInfer all-reduce steps aside for the all-reduces of fewer than %d "
                    "bytes: the custom all-reduce slot (tritoncomm) serves them", ca.max_size)
            return ca if ours else False
    return None


class TritonCommCustomAllreduce(CustomAllReduceSlot):
    """vLLM 0.33's ``CustomAllreduce``, served by tritoncomm: the same constructor, methods and
    return conventions (``CustomAllReduceSlot`` holds them). The multicast (MNNVL) sizes are accepted
    and unused: tritoncomm never uses NVLink multicast. ``symm_mem_enabled`` (vLLM's symmetric-memory
    all-reduce takes the larger sizes) changes nothing: vLLM asks ``ca_comm`` before it either way."""

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, max_size: int = 8192 * 1024,
                 max_all_gather_size: int = 2 * 1024 * 1024, max_mnnvl_all_gather_size: int | None = None,
                 max_reduce_scatter_size: int = 16 * 1024 * 1024, max_mnnvl_reduce_scatter_size: int = 16 * 1024 * 1024,
                 max_mnnvl_multimem_reduce_scatter_size: int = 64 * 1024 * 1024, symm_mem_enabled: bool = False, *,
                 register_graph_buffers: bool = True, config: CommConfig | None = None) -> None:
        super().__init__(group, device, max_size=max_size, max_all_gather_size=max_all_gather_size,
                         max_reduce_scatter_size=max_reduce_scatter_size,
                         register_graph_buffers=register_graph_buffers, config=config,
                         batch_invariant=batch_invariant_mode())
        self.symm_mem_enabled = symm_mem_enabled

    def should_mnnvl_multimem_reduce_scatter(self, inp: torch.Tensor) -> bool:
        """Never: multicast is not used."""
        return False

