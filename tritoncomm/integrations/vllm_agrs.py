"""vLLM's default expert-parallel path on tritoncomm: the ``all_gatherv`` and ``reduce_scatterv`` of
the group that carries it (the data-parallel group; the expert-parallel group with sequence-parallel
MoE or context parallelism).

In data + expert parallel deployments on vLLM's default all-to-all backend
(``allgather_reducescatter``), every MoE layer gathers the tokens of all data-parallel ranks
(``all_gatherv`` of the hidden states with the top-k weights and ids, each rank with its own count)
and reduce-scatters the experts' outputs back to their ranks (``reduce_scatterv``), through NCCL.
With the plugin, that group's device communicator serves both with tritoncomm's ``AllGather`` and
``ReduceScatter`` (``sizes=``): the experts, their format and vLLM's choice of them stay vLLM's.

Rules:
* Built with the group (collective), where the deployment takes that path, after a probe's vote;
  where the probe declines, every call stays vLLM's.
* A call is served where every tensor is on the device, contiguous, gathered or scattered along
  dim 0, of a dtype the kernels move (an all-gather copies bits, so integers travel as floats of
  their width; a reduce-scatter sums floats) and the slots for its largest shard fit
  ``max_bytes``. The decision reads only what every rank passes alike (the sizes, the shapes past
  dim 0, the dtypes), so the ranks never disagree; what is not served takes vLLM's path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..channels import Communicator
from ..collectives import AllGather, ReduceScatter
from ..collectives.validation import SUPPORTED_DTYPES
from ..config import CommConfig
from ..units import round_up
from .capability import probe

__all__ = ["MAX_BYTES", "DataParallelGatherScatter", "carries", "install", "serves"]

#: Bytes of the slots of one call (world x the largest shard), by backend: past them, vLLM's path.
MAX_BYTES = {"cuda": 32 << 20, "cpu": 1 << 20}
#: Floats of an element's width, for the all-gather's bit copies of other dtypes.
_BITS = {2: torch.bfloat16, 4: torch.float32}
#: What the all-gather moves: the kernels' floats, and integers as bits.
_MOVABLE = (*SUPPORTED_DTYPES, torch.int16, torch.int32, torch.int64)


class DataParallelGatherScatter:
    """tritoncomm under the ``all_gatherv`` / ``reduce_scatterv`` of the group that carries vLLM's
    all-gather + reduce-scatter MoE path (``carries``; module docstring). ``group``: the group's
    CPU (gloo) group; ``device``: this rank's. Construction and ``close`` are collective."""

    def __init__(self, group: ProcessGroup, device: torch.device, *, max_bytes: int | None = None) -> None:
        self.disabled = True
        self.world = dist.get_world_size(group)
        self.device = device
        backend = "cpu" if device.type == "cpu" else "cuda"
        self.max_bytes = max_bytes if max_bytes is not None else MAX_BYTES[backend]
        # two workspaces of two halves each, sized for max_bytes, and room for the channels' flags
        config = CommConfig(heap_bytes=round_up(4 * self.max_bytes + (16 << 20), 1 << 20))
        verdict = probe(group, device, config)
        if not verdict.ok:
            verdict.log_once()
            return
        self.comm = Communicator(group, device=device, config=config)
        self.ag = AllGather(self.comm, max_bytes=self.max_bytes, name="vllm.dp.ag")
        self.rs = ReduceScatter(self.comm, max_bytes=self.max_bytes, name="vllm.dp.rs")
        self.disabled = False

    def _fits(self, t: torch.Tensor, rows: list[int], dtypes: tuple, collective: AllGather | ReduceScatter) -> bool:
        """``collective`` moves ``t`` with shards of ``rows`` rows (``fits_rows``)."""
        if t.dim() == 0 or t.device != self.device or not t.is_contiguous() or t.dtype not in dtypes:
            return False
        return collective.fits_rows(rows, int(torch.Size(t.shape[1:]).numel()), t.element_size())

    def all_gatherv(self, input_: torch.Tensor | list[torch.Tensor],
                    sizes: list[int] | None) -> torch.Tensor | list[torch.Tensor] | None:
        """vLLM's ``all_gatherv`` along dim 0 (``sizes``: rows per rank, None for equal), or None
        where vLLM's own path should take it."""
        tensors = [input_] if isinstance(input_, torch.Tensor) else list(input_)
        if self.disabled or not tensors or not all(
                self._fits(t, sizes or [t.shape[0] if t.dim() else 0], _MOVABLE, self.ag) for t in tensors):
            return None
        outs = [self._gather(t, sizes) for t in tensors]
        return outs[0] if isinstance(input_, torch.Tensor) else outs

    def _gather(self, t: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
        if t.dtype in SUPPORTED_DTYPES:
            return self.ag(t, sizes=sizes)
        flat = t.reshape(t.shape[0], int(torch.Size(t.shape[1:]).numel()))  # rows first, as bits
        width = t.element_size()
        bits = flat.view(_BITS[width]) if width in _BITS else flat.view(torch.float32)
        out = self.ag(bits, sizes=sizes).view(t.dtype)
        return out.reshape(out.shape[0], *t.shape[1:])

    def reduce_scatterv(self, input_: torch.Tensor, sizes: list[int] | None,
                        output: torch.Tensor | None) -> torch.Tensor | None:
        """vLLM's ``reduce_scatterv`` along dim 0 into ``output`` (or a new tensor), or None where
        vLLM's own path should take it."""
        if self.disabled or input_.dim() == 0 or (sizes is None and input_.shape[0] % self.world):
            return None
        if not self._fits(input_, sizes or [input_.shape[0] // self.world], SUPPORTED_DTYPES, self.rs):
            return None
        if output is not None and (output.dtype != input_.dtype or not output.is_contiguous()):
            return None
        return self.rs(input_, output, sizes=sizes)

    def close(self) -> None:
        if not self.disabled:
            self.ag.close()
            self.rs.close()
            self.comm.close()
            self.disabled = True


def carries(group: str, p) -> bool:
    """Whether vLLM's group named ``group`` (``"dp"``, ``"ep"``, ...) carries the all-gather +
    reduce-scatter MoE path in a deployment of parallel config ``p``: the group vLLM's
    ``AgRsAll2AllManager`` picks, the expert-parallel group for sequence-parallel MoE (tensor and
    data parallelism both) or context parallelism, else the data-parallel group; never for elastic
    expert parallelism (its stateless groups) or other backends."""
    if not p.enable_expert_parallel or p.enable_elastic_ep or p.all2all_backend != "allgather_reducescatter":
        return False
    if p.use_sequence_parallel_moe:
        return group == "ep"
    if p.data_parallel_size > 1:
        return group == ("ep" if p.prefill_context_parallel_size > 1 else "dp")
    return False


def serves(unique_name: str, cpu_group: ProcessGroup) -> bool:
    """Whether vLLM's group ``unique_name`` (on ``cpu_group``) of the current deployment gets
    ``DataParallelGatherScatter`` (``carries``; a registered group of more than one rank)."""
    from torch.distributed.distributed_c10d import _world
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None or _world.pg_map.get(cpu_group) is None or dist.get_world_size(cpu_group) < 2:
        return False
    return carries(unique_name.split(":")[0], config.parallel_config)


def install() -> str:
    """Make vLLM's CUDA device communicator build ``DataParallelGatherScatter`` for the groups
    ``serves`` names and ask it first in ``all_gatherv`` / ``reduce_scatterv``; closed by the
    communicator's ``destroy``. Returns what it did, for the plugin's one line."""
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    if getattr(CudaCommunicator.all_gatherv, "tritoncomm", False):
        return "data-parallel all-gather + reduce-scatter served"
    init, gatherv, scatterv, destroy = (CudaCommunicator.__init__, CudaCommunicator.all_gatherv,
                                        CudaCommunicator._reduce_scatterv, CudaCommunicator.destroy)

    def __init__(self: CudaCommunicator, cpu_group: ProcessGroup, *args, **kwargs) -> None:
        init(self, cpu_group, *args, **kwargs)
        self.tritoncomm_dp = DataParallelGatherScatter(cpu_group, self.device) \
            if serves(self.unique_name, cpu_group) else None

    def all_gatherv(self: CudaCommunicator, input_, dim: int = 0, sizes: list[int] | None = None):
        served = getattr(self, "tritoncomm_dp", None)
        if served is not None and dim == 0:
            out = served.all_gatherv(input_, sizes)
            if out is not None:
                return out
        return gatherv(self, input_, dim, sizes)

    def _reduce_scatterv(self: CudaCommunicator, input_: torch.Tensor, dim: int, sizes: list[int] | None,
                         output: torch.Tensor | None = None) -> torch.Tensor:
        served = getattr(self, "tritoncomm_dp", None)
        if served is not None and dim in (0, -input_.dim()):
            out = served.reduce_scatterv(input_, sizes, output)
            if out is not None:
                return out
        return scatterv(self, input_, dim, sizes, output)

    def destroy_(self: CudaCommunicator) -> None:
        served = getattr(self, "tritoncomm_dp", None)
        if served is not None:
            served.close()
            self.tritoncomm_dp = None
        destroy(self)

    all_gatherv.tritoncomm = True  # type: ignore[attr-defined]
    CudaCommunicator.__init__ = __init__  # type: ignore[method-assign]
    CudaCommunicator.all_gatherv = all_gatherv  # type: ignore[method-assign]
    CudaCommunicator._reduce_scatterv = _reduce_scatterv  # type: ignore[method-assign]
    CudaCommunicator.destroy = destroy_  # type: ignore[method-assign]
    return "data-parallel all-gather + reduce-scatter served (vLLM's default expert-parallel path)"
