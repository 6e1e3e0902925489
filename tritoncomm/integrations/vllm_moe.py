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

**vLLM's own choice** (``install``, run by the vLLM plugin with ``TRITONCOMM_ENABLE=1`` and
``TRITONCOMM_MOE=1``): in the deployments ``serves`` names (data + expert parallel on vLLM's default
all-to-all backend, ``allgather_reducescatter``), vLLM's oracles pick batched-format experts and
their ``maybe_make_prepare_finalize`` builds this prepare/finalize, on an ``MoEAllToAll`` per layer
shape that ``MoEInstances`` keeps on the expert-parallel group's all-to-all manager. Other
deployments keep vLLM's own path.

Written against vLLM 0.33.0, whose own modular kernel, oracles and batched experts the tests run
(``tests/integrations/test_vllm_moe.py``).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
import torch.distributed as dist
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceDelegate

from ..channels import Communicator
from ..collectives import MoEAllToAll
from ..collectives.moe import MoEHandle, heap_bytes_bound
from ..config import CommConfig
from ..errors import InvalidInputError
from ..units import round_up
from .capability import probe

__all__ = ["MoEInstances", "TritonCommPrepareAndFinalize", "build_prepare_finalize", "install", "serves"]

#: Columns per FP8 scale of the dispatch (``MoEAllToAll`` with ``fp8_dispatch``).
FP8_BLOCK = 128


class TritonCommPrepareAndFinalize(mk.FusedMoEPrepareAndFinalizeModular):
    """vLLM's prepare/finalize on ``moe`` (see the module docstring). ``moe``'s ``max_tokens`` is
    vLLM's tokens per rank and call; its capacity per expert should be ``world * max_tokens`` (the
    default), the rows per expert vLLM's batched experts size their buffers for."""

    def __init__(self, moe: MoEAllToAll, *, dp_bound: bool = False) -> None:
        super().__init__()
        self.moe = moe
        #: bound each call by vLLM's most tokens of any data-parallel rank in the forward (``_tokens_bound``);
        #: only where the expert-parallel group is the data-parallel group (``serves``)
        self.dp_bound = dp_bound
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

    def _tokens_bound(self, n: int) -> int | None:
        """With ``dp_bound``: the most tokens any data-parallel rank has in this forward (vLLM's forward
        context holds every rank's count on the host, the same on every rank; padded alike for CUDA
        graphs), when it is known and bounds this call; the dispatch then takes the path sized for it
        (the one-kernel decode path on instances sized for prefill)."""
        if not self.dp_bound or not is_forward_context_available():
            return None
        meta = get_forward_context().dp_metadata
        if meta is None:
            return None
        bound = max(meta.num_tokens_across_dp_cpu.tolist())
        return bound if n <= bound <= self.moe.max_tokens else None

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
        wants_fp8 = _fp8_dispatch(quant_config)
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
        h, counts, self._handle = moe.dispatch(a1, topk_ids, topk_weights, tokens_bound=self._tokens_bound(a1.shape[0]))
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


# -- vLLM's own choice -------------------------------------------------------------------------------
def serves(p: FusedMoEParallelConfig) -> bool:
    """Whether tritoncomm takes a MoE layer's all-to-all once installed: expert parallelism over
    data-parallel ranks on vLLM's default backend (``allgather_reducescatter``), one rank per
    replica (no tensor, context or sequence parallelism: tensor-parallel ranks of a replica hold the
    same tokens, which an all-to-all would send twice), and vLLM's linear expert placement (no
    expert load balancing, which moves experts)."""
    # with expert parallelism vLLM folds the deployment's tensor-parallel ranks into ``ep_size``
    return (p.use_ag_rs_all2all_kernels and p.ep_size == p.dp_size and p.tp_size == 1 and p.pcp_size == 1
            and not p.is_sequence_parallel and not p.enable_eplb)


def _fp8_dispatch(quant_config: FusedMoEQuantConfig | None) -> bool:
    """The dispatch's wire format the experts' quantisation asks for: bf16/fp16 rows, or e4m3 rows
    with one scale per 128 columns; others are refused (before any rank waits)."""
    if quant_config is None or quant_config.quant_dtype is None:
        return False
    if quant_config.quant_dtype == torch.float8_e4m3fn and list(quant_config.block_shape or ()) == [FP8_BLOCK,
                                                                                                   FP8_BLOCK]:
        return True
    raise InvalidInputError(f"tritoncomm MoE: the experts quantise activations to {quant_config.quant_dtype} in "
                            f"blocks {quant_config.block_shape}; the dispatch carries bf16/fp16 rows or e4m3 with "
                            f"one scale per {FP8_BLOCK} columns")


class MoEInstances:
    """The ``MoEAllToAll`` instances of one expert-parallel group, one per layer shape, each on a
    communicator of its own whose heap ``heap_bytes_bound`` sizes. ``get`` is collective the first
    time a shape is asked for (every rank builds its layers in the same order); ``close`` is
    collective."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group, self.device = group, device
        self._made: dict[tuple, tuple[Communicator, MoEAllToAll]] = {}

    def get(self, *, max_tokens: int, hidden: int, num_experts: int, top_k: int, dtype: torch.dtype,
            fp8_dispatch: bool) -> MoEAllToAll:
        key = (max_tokens, hidden, num_experts, top_k, dtype, fp8_dispatch)
        if key not in self._made:
            backend = "cpu" if self.device.type == "cpu" else "cuda"
            world = dist.get_world_size(self.group)
            heap = heap_bytes_bound(backend, self.device, world, max_tokens=max_tokens, hidden=hidden,
                                    num_experts=num_experts, top_k=top_k, dtype=dtype, fp8_dispatch=fp8_dispatch)
            config = CommConfig(heap_bytes=round_up(heap, 1 << 20))
            verdict = probe(self.group, self.device, config)
            if not verdict.ok:
                raise InvalidInputError(f"tritoncomm MoE: cannot serve the expert-parallel all-to-all: "
                                        f"{verdict.reason} (the expert buffers hold {world} x {max_tokens} rows per "
                                        f"local expert; vLLM's --max-num-batched-tokens sets {max_tokens}). Lower it "
                                        f"or unset TRITONCOMM_MOE")
            comm = Communicator(self.group, device=self.device, config=config)
            try:
                moe = MoEAllToAll(comm, max_tokens=max_tokens, hidden=hidden, num_experts=num_experts, top_k=top_k,
                                  dtype=dtype, fp8_dispatch=fp8_dispatch, name=f"vllm.moe{len(self._made)}")
            except BaseException:
                comm.close()
                raise
            self._made[key] = (comm, moe)
        return self._made[key][1]

    def __len__(self) -> int:
        return len(self._made)

    def close(self) -> None:
        """Collective: close every instance and its communicator."""
        for comm, moe in reversed(list(self._made.values())):
            moe.close()
            comm.close()
        self._made.clear()


def _instances(manager: Any, device: torch.device) -> MoEInstances:
    """The group's ``MoEInstances``, kept on vLLM's all-to-all manager of the expert-parallel group
    and closed when vLLM destroys it."""
    found = getattr(manager, "tritoncomm_moe", None)
    if found is None:
        found = manager.tritoncomm_moe = MoEInstances(manager.cpu_group, device)
        destroy = manager.destroy

        def destroy_both() -> None:
            found.close()
            destroy()

        manager.destroy = destroy_both
    return found


def _device(moe: FusedMoEConfig) -> torch.device:
    dev = torch.device(moe.device) if moe.device is not None else torch.device("cuda")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def build_prepare_finalize(moe: FusedMoEConfig, quant_config: FusedMoEQuantConfig | None,
                           all2all_manager: Any | None = None,
                           use_monolithic: bool = False) -> TritonCommPrepareAndFinalize:
    """The prepare/finalize ``install`` has vLLM build for a layer that ``serves`` names, on the
    group's instance for its shape (collective the first time). Refuses, before any rank waits,
    what it cannot serve: monolithic experts, micro-batching, elastic expert parallelism,
    quantisations other than FP8 blocks of 128, experts that do not split evenly."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.fused_moe.all2all_utils import get_ep_all2all_manager

    if use_monolithic:
        raise InvalidInputError("tritoncomm MoE: monolithic experts route inside their kernel; the dispatch needs "
                                "the routed ids. Choose other experts or unset TRITONCOMM_MOE")
    parallel = get_current_vllm_config().parallel_config
    if parallel.use_ubatching:
        raise InvalidInputError("tritoncomm MoE: micro-batching (--enable-dbo, ubatch_size > 1) interleaves two "
                                "dispatches; one instance serves one at a time. Unset TRITONCOMM_MOE")
    if parallel.enable_elastic_ep:
        raise InvalidInputError("tritoncomm MoE: elastic expert parallelism changes the group's size; an "
                                "instance is built for one. Unset TRITONCOMM_MOE")
    fp8 = _fp8_dispatch(quant_config)
    manager = all2all_manager if all2all_manager is not None else get_ep_all2all_manager()
    world = manager.world_size
    if moe.num_experts % world or moe.num_experts // world != moe.num_local_experts:
        raise InvalidInputError(f"tritoncomm MoE: {moe.num_experts} experts over {world} ranks with "
                                f"{moe.num_local_experts} here; the dispatch needs them split evenly")
    instances = _instances(manager, _device(moe))
    return TritonCommPrepareAndFinalize(instances.get(
        max_tokens=moe.max_num_tokens, hidden=moe.hidden_dim, num_experts=moe.num_experts,
        top_k=moe.experts_per_token, dtype=moe.in_dtype, fp8_dispatch=fp8), dp_bound=True)


def install() -> str:
    """Has vLLM choose tritoncomm's prepare/finalize where ``serves`` says so (once per process;
    no collective): vLLM's ``FusedMoEParallelConfig.use_batched_activation_format`` (read by its
    oracles to pick the experts' format) also answers for those layers, and its
    ``maybe_make_prepare_finalize``, wherever a module holds it, builds ``build_prepare_finalize``'s
    for them and asks vLLM's own for the others. Returns a line for the log."""
    from vllm.model_executor.layers.fused_moe import all2all_utils

    original = all2all_utils.maybe_make_prepare_finalize
    if getattr(original, "tritoncomm", False):
        return "expert-parallel all-to-all already installed"
    batched = FusedMoEParallelConfig.use_batched_activation_format

    def use_batched_activation_format(self: FusedMoEParallelConfig) -> bool:
        return batched.fget(self) or serves(self)

    FusedMoEParallelConfig.use_batched_activation_format = property(use_batched_activation_format,
                                                                    doc=batched.__doc__)
    signature = inspect.signature(original)

    def maybe_make_prepare_finalize(*args: Any, **kwargs: Any) -> mk.FusedMoEPrepareAndFinalize | None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if not (a["allow_new_interface"] and serves(a["moe"].moe_parallel_config)):
            return original(*args, **kwargs)
        return build_prepare_finalize(a["moe"], a["quant_config"], a["all2all_manager"], a["use_monolithic"])

    maybe_make_prepare_finalize.tritoncomm = True
    maybe_make_prepare_finalize.__doc__ = original.__doc__
    rebound = 0
    for module in list(sys.modules.values()):  # the oracles hold it by name (``from ... import``)
        if getattr(module, "maybe_make_prepare_finalize", None) is original:
            module.maybe_make_prepare_finalize = maybe_make_prepare_finalize
            rebound += 1
    return (f"expert-parallel all-to-all (data + expert parallel on the allgather_reducescatter backend; "
            f"{rebound} vLLM modules rebound)")
