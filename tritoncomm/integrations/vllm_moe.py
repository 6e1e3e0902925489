"""vLLM: tritoncomm's expert-parallel all-to-all as a prepare/finalize of vLLM's modular MoE kernel.

vLLM builds a fused MoE layer from two parts (``modular_kernel.FusedMoEKernel``): a
prepare/finalize, which moves tokens to the experts' ranks and the results back, and a fused-experts
class, which runs the local experts. ``TritonCommPrepareAndFinalize`` is the first part in vLLM's
batched-experts format (``[local_experts, capacity, hidden]`` and the per-expert token counts on the
device), the format of DeepEP's low-latency and pplx's prepare/finalize, so it pairs with vLLM's
batched experts classes (``BatchedTritonExperts``, ``NaiveBatchedExperts``, ...):

* ``prepare`` is ``MoEAllToAll.dispatch``: bf16/fp16 rows, or with an FP8 instance e4m3 rows and one
  fp32 scale per 128 columns, the block quantisation the experts' ``quant_config`` names;
* ``finalize`` is ``MoEAllToAll.combine``: the top-k weights are applied and summed there, in a fixed
  order, so the experts' weight-and-reduce step must be vLLM's delegate (as with DeepEP), and each
  rank gets the finished output of its own tokens (``output_is_reduced``).

No host synchronisation in a call; the counts stay on the device. Experts are split evenly and in
order (rank ``r`` holds ``[r * L, (r + 1) * L)``), vLLM's linear placement: an ``expert_map`` that
says otherwise is refused (each new map tensor is compared once, on the host).
``apply_router_weight_on_input`` (top-1 only, as in vLLM) scales the input and combines with unit
weights.

Written against vLLM 0.33.0, whose own modular kernel and batched experts the tests run
(``tests/integrations/test_vllm_moe.py``).
"""

from __future__ import annotations

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceDelegate

from ..collectives import MoEAllToAll
from ..collectives.moe import MoEHandle
from ..errors import InvalidInputError

__all__ = ["TritonCommPrepareAndFinalize"]

#: Columns per FP8 scale of the dispatch (``MoEAllToAll`` with ``fp8_dispatch``).
FP8_BLOCK = 128


class TritonCommPrepareAndFinalize(mk.FusedMoEPrepareAndFinalizeModular):
    """vLLM's prepare/finalize on ``moe`` (see the module docstring). ``moe``'s ``max_tokens`` is
    vLLM's tokens per rank and call; its capacity per expert should be ``world * max_tokens`` (the
    default), the rows per expert vLLM's batched experts size their buffers for."""

    def __init__(self, moe: MoEAllToAll) -> None:
        super().__init__()
        self.moe = moe
        self._handle: MoEHandle | None = None
        self._checked_map: torch.Tensor | None = None  # the expert_map last checked (linear placement)
        dev = moe.comm.device
        # apply_router_weight_on_input (top-1): the weighted input and unit weights, made once
        self._weighted = torch.empty(moe.max_tokens, moe.hidden, dtype=moe.dtype, device=dev) if moe.top_k == 1 \
            else None
        self._ones = torch.ones(moe.max_tokens, 1, dtype=torch.float32, device=dev) if moe.top_k == 1 else None

    @property
    def activation_format(self) -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.BatchedExperts

    def topk_indices_dtype(self) -> torch.dtype | None:
        return None  # int32 and int64 both

    def max_num_tokens_per_rank(self) -> int | None:
        return self.moe.max_tokens

    def num_dispatchers(self) -> int:
        return self.moe.world

    def output_is_reduced(self) -> bool:
        return True

    def allocate_fused_expert_output(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                                     weight_and_reduce_impl: mk.TopKWeightAndReduce) -> torch.Tensor | None:
        """The combine's own input buffer when the experts' output has its shape: the experts then
        write where the combine reads, and ``finalize`` copies nothing."""
        buf = self.moe.expert_buffer()
        if tuple(shape) == tuple(buf.shape) and dtype == buf.dtype and torch.device(device) == buf.device:
            return buf
        return None

    def _check_expert_map(self, expert_map: torch.Tensor | None) -> None:
        if expert_map is None or expert_map is self._checked_map:
            return
        moe = self.moe
        want = torch.full((moe.num_experts,), -1, dtype=expert_map.dtype, device=expert_map.device)
        lo = moe.rank * moe.local_experts
        want[lo:lo + moe.local_experts] = torch.arange(moe.local_experts, dtype=expert_map.dtype,
                                                       device=expert_map.device)
        if not torch.equal(expert_map, want):
            raise InvalidInputError("tritoncomm MoE prepare: expert_map must be the linear placement (rank r holds "
                                    f"experts [r * {moe.local_experts}, (r + 1) * {moe.local_experts}))")
        self._checked_map = expert_map

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: torch.Tensor | None, apply_router_weight_on_input: bool,
                quant_config: FusedMoEQuantConfig, defer_input_quant: bool = False) -> mk.PrepareResultType:
        """``MoEAllToAll.dispatch`` in vLLM's batched format. Collective."""
        moe = self.moe
        if defer_input_quant:
            raise InvalidInputError("tritoncomm MoE prepare: defer_input_quant is not supported; pair it with "
                                    "experts that take the dispatched (quantised) rows")
        if num_experts != moe.num_experts:
            raise InvalidInputError(f"tritoncomm MoE prepare: {num_experts} experts, the instance has "
                                    f"{moe.num_experts}")
        self._check_expert_map(expert_map)
        wants_fp8 = quant_config.quant_dtype is not None
        if wants_fp8 and not (quant_config.quant_dtype == torch.float8_e4m3fn
                              and list(quant_config.block_shape or ()) == [FP8_BLOCK, FP8_BLOCK]):
            raise InvalidInputError("tritoncomm MoE prepare: the dispatch quantises to e4m3 with one scale per "
                                    f"{FP8_BLOCK} columns; the experts ask for {quant_config.quant_dtype} blocks "
                                    f"{quant_config.block_shape}")
        if wants_fp8 != moe.fp8:
            raise InvalidInputError(f"tritoncomm MoE prepare: the experts {'want' if wants_fp8 else 'do not want'} "
                                    f"FP8 rows; build MoEAllToAll with fp8_dispatch={wants_fp8}")
        if apply_router_weight_on_input:
            if self._weighted is None or topk_ids.shape[1] != 1 or a1.shape[0] > moe.max_tokens:
                raise InvalidInputError("tritoncomm MoE prepare: apply_router_weight_on_input needs a top-1 instance "
                                        f"and at most {moe.max_tokens} tokens")
            n = a1.shape[0]
            a1 = torch.mul(a1, topk_weights.to(a1.dtype), out=self._weighted[:n])
            topk_weights = self._ones[:n]
        h, counts, self._handle = moe.dispatch(a1, topk_ids, topk_weights)
        meta = mk.ExpertTokensMetadata(expert_num_tokens=counts, expert_num_tokens_cpu=None)
        if isinstance(h, tuple):  # FP8: e4m3 rows and [local, capacity, hidden / 128] fp32 scales
            return h[0], h[1], meta, None, None
        return h, None, meta, None, None

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool,
                 weight_and_reduce_impl: mk.TopKWeightAndReduce) -> None:
        """``MoEAllToAll.combine`` of the experts' output (its first ``capacity`` rows per expert) into
        ``output``. Collective."""
        if not isinstance(weight_and_reduce_impl, TopKWeightAndReduceDelegate):
            raise InvalidInputError("tritoncomm MoE finalize: the combine applies the top-k weights; the experts' "
                                    f"weight-and-reduce must be vLLM's delegate, got "
                                    f"{type(weight_and_reduce_impl).__name__}")
        if self._handle is None:
            raise InvalidInputError("tritoncomm MoE finalize: no prepare before it")
        handle, self._handle = self._handle, None
        moe = self.moe
        y = fused_expert_output
        if y.dim() != 3 or y.shape[0] != moe.local_experts or y.shape[1] < moe.capacity:
            raise InvalidInputError(f"tritoncomm MoE finalize: the experts' output must be [{moe.local_experts}, "
                                    f">= {moe.capacity}, {moe.hidden}], got {list(y.shape)}")
        out = moe.combine(y[:, :moe.capacity], handle)
        output.copy_(out)
