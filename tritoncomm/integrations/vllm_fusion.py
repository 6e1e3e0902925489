"""vLLM: the fused all-reduce + residual add + RMSNorm (+ static FP8 quant) in compiled graphs.

``TritonCommFusionPass`` is a post-grad pass of vLLM's pass manager (``install`` puts it there,
ahead of vLLM's own fusions, so that the norm is still unfused when it looks). It rewrites, in the
graphs vLLM compiles, the patterns made of vLLM's own ops:

* ``tensor_model_parallel_all_reduce(x)`` then ``vllm.ir.ops.fused_add_rms_norm(., residual, w, eps)``
  (both outputs, or the norm alone);
* the same followed by vLLM's static per-tensor FP8 quantisation (``QuantFP8``) of the norm;
* ``tensor_model_parallel_all_reduce(x)`` then ``vllm.ir.ops.rms_norm(., w, eps)`` (with and without
  that quantisation), the first layer's norm, as the add of a zero residual;

into one ``tritoncomm::vllm_fused_add_rms_norm`` op, served by the TP group's
``TritonCommCustomAllreduce`` (its ``fused_add_rms_norm``, set up by the pass for
``min(max_num_batched_tokens, MAX_FUSED_BYTES / (2 x hidden))`` tokens). The op keeps the unfused
path's rounding; shapes it does not serve run that unfused path inside the op, so every shape
compiles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.pattern_matcher as pm
import vllm.ir.ops as ir_ops
from torch import fx
from torch._inductor.pattern_matcher import PatternMatcherPass
from vllm.compilation.passes.inductor_pass import enable_fake_mode
from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass, VllmPatternMatcherPass
from vllm.config import VllmConfig
from vllm.distributed import get_tp_group, tensor_model_parallel_all_reduce

from .custom_allreduce import FUSED_RESERVE_BYTES, CustomAllReduceSlot

__all__ = ["EPSILONS", "MAX_FUSED_BYTES", "TritonCommFusionPass", "install"]

log = logging.getLogger("vllm.tritoncomm")

#: The RMSNorm epsilons the patterns are registered for (those vLLM's models use).
EPSILONS = (1e-5, 1e-6)
#: The fused op is set up for at most this many bytes of 16-bit input (the rest runs unfused).
MAX_FUSED_BYTES = FUSED_RESERVE_BYTES
_FP8 = torch.float8_e4m3fn
_FP8_MAX = torch.finfo(_FP8).max


def _coordinator(group: str) -> Any:
    from vllm.distributed.parallel_state import _groups

    ref = _groups.get(group)
    coord = ref() if ref is not None else None
    if coord is None:
        raise ValueError(f"tritoncomm: vLLM group {group!r} is not (or no longer) initialised")
    return coord


def _unfused(coord: Any, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
             scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's own path: its all-reduce, its add + RMSNorm, then its static FP8 quantisation."""
    y = coord.all_reduce(x)
    out, residual_out = ir_ops.fused_add_rms_norm(y, residual, weight, eps)
    if scale is not None:
        out = (out.to(torch.float32) * scale.to(torch.float32).reciprocal()).clamp(-_FP8_MAX, _FP8_MAX).to(_FP8)
    return out, residual_out


@torch.library.custom_op("tritoncomm::vllm_fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str,
                          scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm, residual + all_reduce(x))`` over vLLM group ``group``; ``norm`` in FP8 e4m3 given the
    static ``scale``. Served by the group's tritoncomm ``ca_comm`` where it can, else vLLM's path."""
    coord = _coordinator(group)
    ca = getattr(coord.device_communicator, "ca_comm", None)
    h = x.shape[-1]
    x2, r2 = x.reshape(-1, h), residual.reshape(-1, h)
    if isinstance(ca, CustomAllReduceSlot) and ca.should_fused_norm(x2, r2, weight):
        out, res = ca.fused_add_rms_norm(x2, r2, weight, eps, fp8_scale=scale)
        return out.view(x.shape), res.view(x.shape)
    if isinstance(ca, CustomAllReduceSlot) and ca.should_invariant_norm(x2, r2, weight):  # batch-invariant mode
        out, res = ca.invariant_add_rms_norm(x2, r2, weight, eps, fp8_scale=scale)
        return out.view(x.shape), res.view(x.shape)
    return _unfused(coord, x, residual, weight, eps, scale)


@fused_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: str,
      scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, dtype=_FP8 if scale is not None else x.dtype), torch.empty_like(residual)


def _fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
           scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.tritoncomm.vllm_fused_add_rms_norm.default(x, residual, weight, eps, get_tp_group().unique_name,
                                                                scale)


def _patterns(eps: float, quant: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
              residual: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> list[tuple[Callable, Callable, list]]:
    """(pattern, replacement, example inputs) for one epsilon, most specific first."""

    def add_norm(x, residual, w):
        return ir_ops.fused_add_rms_norm(tensor_model_parallel_all_reduce(x), residual, w, eps)

    def add_norm_fused(x, residual, w):
        return _fused(x, residual, w, eps)

    def add_norm_only(x, residual, w):  # the new residual unused (the graph's last layer)
        return add_norm(x, residual, w)[0]

    def add_norm_only_fused(x, residual, w):
        return _fused(x, residual, w, eps)[0]

    def add_norm_quant(x, residual, w, scale):
        y, res = add_norm(x, residual, w)
        return quant(y, scale), res

    def add_norm_quant_fused(x, residual, w, scale):
        return _fused(x, residual, w, eps, scale)

    def norm(x, w):  # the first layer: the all-reduced input is the residual from here on
        y = tensor_model_parallel_all_reduce(x)
        return ir_ops.rms_norm(y, w, eps), y

    def norm_fused(x, w):
        return _fused(x, torch.zeros_like(x), w, eps)

    def norm_quant(x, w, scale):
        out, y = norm(x, w)
        return quant(out, scale), y

    def norm_quant_fused(x, w, scale):
        return _fused(x, torch.zeros_like(x), w, eps, scale)

    return [(add_norm_quant, add_norm_quant_fused, [x, residual, w, scale]),
            (norm_quant, norm_quant_fused, [x, w, scale]),
            (add_norm, add_norm_fused, [x, residual, w]),
            (add_norm_only, add_norm_only_fused, [x, residual, w]),
            (norm, norm_fused, [x, w])]


class TritonCommFusionPass(VllmPatternMatcherPass):
    """See the module docstring. Built by vLLM's pass manager on every rank at the same point (as
    its own all-reduce fusion pass is): setting up the fused op is collective over the TP group.

    Args:
        config: vLLM's config (model dtype, hidden size, device, batched-token bound).
        hidden, max_tokens, dtype: override what the config says (its model config may be absent).
    """

    def __init__(self, config: VllmConfig, *, hidden: int | None = None, max_tokens: int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(config)
        self.disabled, self.reason = True, ""
        self.patterns = PatternMatcherPass(pass_name="tritoncomm_fusion_pass")
        mc = config.model_config
        tp = get_tp_group()
        ca = getattr(tp.device_communicator, "ca_comm", None)
        dtype = dtype or (self.model_dtype if mc is not None else None)
        if hidden is None and mc is not None:
            hidden = mc.get_hidden_size()
        if tp.world_size < 2:
            self.reason = "tensor parallelism of one rank"
        elif not isinstance(ca, CustomAllReduceSlot) or ca.disabled:
            self.reason = "tritoncomm does not serve the TP group"
        elif hidden is None or dtype not in (torch.bfloat16, torch.float16):
            self.reason = f"no 16-bit model with a known hidden size (dtype {dtype}, hidden {hidden})"
        if self.reason:
            log.info("tritoncomm: fusion pass inactive: %s", self.reason)
            return
        batched = config.scheduler_config.max_num_batched_tokens if config.scheduler_config else None
        cap = max(1, MAX_FUSED_BYTES // (2 * hidden))
        self.max_tokens = max_tokens or min(cap, batched or cap)
        self.hidden, self.dtype, self.tp_name = hidden, dtype, tp.unique_name
        if not ca.setup_fused_norm(self.max_tokens, hidden):
            self.reason = f"hidden size {hidden} is not served"
            log.info("tritoncomm: fusion pass inactive: %s", self.reason)
            return
        self._register()
        self.disabled = False

    def _quant(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """vLLM's static per-tensor FP8 quantisation as its models run it (``QuantFP8``: its custom op
        where enabled, else its native torch code), returning the FP8 tensor."""
        from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
        from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

        q = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR, compile_native=False)
        if not QuantFP8.enabled():
            return lambda y, scale: q.forward_native(y, scale)[0]
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        op = torch.ops._C.static_scaled_fp8_quant.default

        def custom(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            result = torch.empty(y.shape, device=y.device, dtype=_FP8)
            return auto_functionalized(op, result=result, input=y, scale=scale, group_shape=[-1, -1])[1]

        return custom

    @enable_fake_mode
    def _register(self) -> None:
        quant = self._quant()
        x, residual, w = (torch.empty(*s, dtype=self.dtype, device=self.device) for s in ((5, 16), (5, 16), (16,)))
        scale = torch.empty(1, dtype=torch.float32, device=self.device)
        for eps in EPSILONS:
            # the quantised patterns first: they contain the plain ones
            for pattern, replacement, inputs in _patterns(eps, quant, x, residual, w, scale):
                pm.register_replacement(pattern, replacement, inputs, pm.fwd_only, self.patterns)
            torch._inductor.pattern_matcher._seen_patterns.clear()  # the same shapes again for the next eps

    @VllmInductorPass.time_and_log
    def __call__(self, graph: fx.Graph) -> None:
        if self.disabled:
            return
        self.matched_count = self.patterns.apply(graph)
        log.debug("tritoncomm fusion pass: %d matches", self.matched_count)


#: The vLLM passes that must see the graph before ours (they only canonicalise it).
_BEFORE_US = ("NoOpEliminationPass", "AddRMSNormFusionPass", "RocmAiterTritonAddRMSNormPadFusionPass")


def install() -> str:
    """Make vLLM's post-grad pass manager run ``TritonCommFusionPass``, right after the passes that
    only canonicalise the graph and before every fusion (vLLM's all-reduce fusion then finds nothing
    left to fuse). Returns what it did, for the plugin's one line."""
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    if getattr(PostGradPassManager.configure, "tritoncomm", False):
        return "fusion pass installed"
    original = PostGradPassManager.configure

    def configure(self: PostGradPassManager, config: VllmConfig) -> None:
        original(self, config)
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(config, check_compile=False):
            ours = TritonCommFusionPass(config)
        at = 0
        while at < len(self.passes) and type(self.passes[at]).__name__ in _BEFORE_US:
            at += 1
        self.passes.insert(at, ours)

    configure.tritoncomm = True  # type: ignore[attr-defined]
    PostGradPassManager.configure = configure  # type: ignore[method-assign]
    return "fused all-reduce + RMSNorm (+ FP8) pass installed in compiled graphs"
