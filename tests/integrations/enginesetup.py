"""The engines set up inside a rank, once per rank process: vLLM's plugins and groups (``vllm_up``),
SGLang's plugins and TP group (``sglang_up``)."""

from __future__ import annotations

import torch

__all__ = ["as_cuda_platform", "sglang_tp", "sglang_up", "vllm_up"]

_VLLM_STATE: list = []  # inside a rank: vLLM's config scope, for the life of the rank process


def as_cuda_platform() -> None:
    """Point the platform vLLM runs on at vLLM's CUDA communicator and its custom-op collectives."""
    from vllm.platforms import current_platform

    p = type(current_platform)
    p.get_device_communicator_cls = classmethod(
        lambda cls: "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator")
    p.use_custom_op_collectives = classmethod(lambda cls: True)


def vllm_up(ctx) -> None:
    """Load plugins (vLLM's loader) and build vLLM's groups, once per rank process."""
    import vllm.distributed.parallel_state as ps
    import vllm.plugins
    from vllm.config import VllmConfig, set_current_vllm_config

    if ps.model_parallel_is_initialized():
        return
    vllm.plugins.load_general_plugins()
    as_cuda_platform()
    scope = set_current_vllm_config(VllmConfig())
    scope.__enter__()  # for the life of the rank, as in a vLLM worker
    _VLLM_STATE.append(scope)
    ps.init_distributed_environment(world_size=ctx.world, rank=ctx.rank, local_rank=ctx.rank, backend="gloo",
                                    distributed_init_method=None)
    ps.initialize_model_parallel(tensor_model_parallel_size=ctx.world)


_SGLANG_STATE: list = []  # inside a rank: SGLang's TP group, for the life of the rank process


def sglang_up(ctx) -> None:
    """Load plugins (SGLang's loader) and build SGLang's TP group, once per rank process."""
    if _SGLANG_STATE:
        return
    import logging

    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_parallel

    logging.basicConfig(level=logging.INFO)
    load_plugins()
    if torch.accelerator.current_accelerator() is not None and not torch.accelerator.is_available():
        # a CUDA build of torch on a machine with no GPU: SGLang's stream helper asks torch's accelerator module
        # (torch.cuda there); answer as a CPU build of torch does, whose accelerator module is torch.cpu
        ps.get_current_device_stream_fast = torch.cpu.current_stream
    tp = ps.init_model_parallel_group([list(range(ctx.world))], ctx.rank, "gloo", use_pynccl=False, group_name="tp")
    get_parallel().override_permanently(tp_group=tp, attn_tp_group=tp, tp_size=ctx.world, attn_tp_size=ctx.world,
                                        tp_rank=ctx.rank, attn_tp_rank=ctx.rank)
    _SGLANG_STATE.append(tp)


def sglang_tp():
    """The TP group ``sglang_up`` built in this rank."""
    return _SGLANG_STATE[0]
