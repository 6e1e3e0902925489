"""vLLM: a drop-in for its custom all-reduce (``TritonCommCustomAllreduce``), a device communicator
a platform plugin can name, and the fused all-reduce + RMSNorm entry in the shape vLLM's all-reduce
fusion pass calls.

Written against vLLM's published source (``vllm/distributed/device_communicators/custom_all_reduce.py``,
``cuda_communicator.py`` and ``vllm/compilation/passes/fusion/allreduce_rms_fusion.py``):

* ``CustomAllreduce(group, device, max_size=8192 * 1024, symm_mem_enabled=False)`` with
  ``disabled``, ``should_custom_ar(inp)``, ``all_reduce(inp, *, out=None, registered=False)``,
  ``custom_all_reduce(input) -> Tensor | None``, ``capture()``, ``finalize_p2p()``, ``close()``;
* ``CudaCommunicator(cpu_group, device=None, device_group=None, unique_name="")`` with
  ``all_reduce(input_) -> Tensor`` (which tries ``ca_comm`` before pynccl) and ``destroy()``;
* ``flashinfer_trtllm_fused_allreduce_norm(allreduce_in, residual, rms_gamma, rms_eps, world_size,
  launch_with_pdl, fp32_acc, max_token_num, pattern_code, norm_out=None, quant_out=None,
  scale_out=None, scale_factor=None, weight_bias=0.0) -> None``, which mutates its tensors:
  with ``norm_out=None`` the normalised rows go over ``allreduce_in`` and ``residual`` is updated
  in place; with ``norm_out`` given, ``allreduce_in`` receives the new residual and ``residual`` is
  left alone. ``weight_bias=1.0`` is Gemma's ``(1 + w)``. Pattern codes (FlashInfer's
  ``AllReduceFusionPattern``): 1 = residual + RMSNorm, 2 = ... + FP8 quant into ``quant_out``.

``group`` is the engine's CPU (gloo) group. A capability probe decides, by one vote on that group,
whether tritoncomm serves it; if not, ``disabled`` is True, one line ``tritoncomm disabled because
...`` is logged, ``custom_all_reduce`` returns None and the engine falls back to NCCL, exactly as
with its own custom all-reduce. Nothing here exits or hangs.

Every launch is graph-safe without registration. ``capture()``, which the engine wraps around its
graph captures, also registers the captured all-reduce outputs on exit
(``Communicator.graph_capture``), as the engine's own kernels do with their graph buffers: the
two-shot then writes peers' outputs directly instead of copying out of the heap. Graphs captured
inside are replayed after it exits.

The communicator subclass is built on first use from the installed vLLM (``TritonCommCudaCommunicator``
below, e.g. ``get_device_communicator_cls()`` returning
``"tritoncomm.integrations.vllm.TritonCommCudaCommunicator"``); ``make_device_communicator(base)``
builds it over any base with vLLM's constructor. For TP groups it puts ``TritonCommCustomAllreduce``
in front of vLLM's own path; when the probe says no (or an input does not qualify) vLLM's path runs
unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed import ProcessGroup

from ..channels import Communicator
from ..collectives import AllReduce, FusedAllReduceAddRMSNorm
from ..collectives.validation import SUPPORTED_DTYPES
from ..errors import InvalidInputError
from .capability import probe

__all__ = ["PATTERN_RESIDUAL_RMSNORM", "PATTERN_RESIDUAL_RMSNORM_FP8", "TritonCommCustomAllreduce",
           "VllmFusedAllReduceNorm", "make_device_communicator"]

PATTERN_RESIDUAL_RMSNORM = 1
PATTERN_RESIDUAL_RMSNORM_FP8 = 2


class TritonCommCustomAllreduce:
    """vLLM's ``CustomAllreduce`` contract, served by tritoncomm."""

    _SUPPORTED_WORLD_SIZES = (2, 3, 4, 5, 6, 7, 8)

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, max_size: int = 8192 * 1024,
                 symm_mem_enabled: bool = False) -> None:
        self._IS_CAPTURING = False
        self.disabled = True
        self.max_size = max_size
        self.group = group
        if isinstance(device, int):
            device = torch.device("cuda", device)
        elif isinstance(device, str):
            device = torch.device(device)
        self.device = device
        verdict = probe(group, device)
        if not verdict.ok:
            verdict.log_once()
            return
        self.comm = Communicator(group, device=device)
        self.ar = AllReduce(self.comm, max_bytes=max_size)
        self.disabled = False

    def finalize_p2p(self) -> None:
        """Nothing to finish: peer access was checked by the probe at construction."""

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Collective: wrap every graph capture; on GPUs the captured outputs are registered on exit
        (replay only after it)."""
        self._IS_CAPTURING = True
        try:
            if self.disabled or self.comm.backend != "cuda":
                yield
            else:
                with self.comm.graph_capture():
                    yield
        finally:
            self._IS_CAPTURING = False

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        if self.disabled:
            return False
        return (inp.dtype in SUPPORTED_DTYPES and inp.is_contiguous() and inp.device == self.device
                and inp.numel() * inp.element_size() < self.max_size)

    def all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None,
                   registered: bool = False) -> torch.Tensor:
        """Out-of-place sum (``registered`` is accepted for compatibility and ignored)."""
        return self.ar(inp, out=out)

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        """The sum of ``input`` over the group, or None when the caller should use NCCL."""
        if not self.should_custom_ar(input):
            return None
        return self.all_reduce(input)

    def close(self) -> None:
        if not self.disabled:
            self.ar.close()
            self.comm.close()
            self.disabled = True


class VllmFusedAllReduceNorm:
    """vLLM's fused all-reduce + (residual) RMSNorm entry, served by ``FusedAllReduceAddRMSNorm``.

    Collective to create (before graph capture) and close. ``__call__`` has vLLM's signature and
    conventions (module docstring); ``launch_with_pdl`` and ``fp32_acc`` are accepted and ignored
    (we always accumulate in fp32; PDL is the algorithm's own choice). It rounds where vLLM's unfused
    path rounds (``rounding="engine"``), so turning the fusion on does not change the residual.
    """

    def __init__(self, comm: Communicator, max_token_num: int, hidden_size: int, eps: float = 1e-6) -> None:
        self.comm = comm
        self.max_token_num, self.hidden_size = max_token_num, hidden_size
        self.fused = FusedAllReduceAddRMSNorm(comm, max_tokens=max_token_num, max_hidden=hidden_size, eps=eps,
                                              rounding="engine", name="vllm_fused_norm")

    def __call__(self, allreduce_in: torch.Tensor, residual: torch.Tensor, rms_gamma: torch.Tensor, rms_eps: float,
                 world_size: int, launch_with_pdl: bool, fp32_acc: bool, max_token_num: int, pattern_code: int,
                 norm_out: torch.Tensor | None = None, quant_out: torch.Tensor | None = None,
                 scale_out: torch.Tensor | None = None, scale_factor: torch.Tensor | None = None,
                 weight_bias: float = 0.0) -> None:
        what = "vLLM fused all-reduce + RMSNorm"
        if world_size != self.comm.world:
            raise InvalidInputError(f"{what}: world_size {world_size} != this group's {self.comm.world}")
        if weight_bias not in (0.0, 1.0):
            raise InvalidInputError(f"{what}: weight_bias must be 0.0 or 1.0 (Gemma), got {weight_bias}")
        if pattern_code not in (PATTERN_RESIDUAL_RMSNORM, PATTERN_RESIDUAL_RMSNORM_FP8):
            raise InvalidInputError(f"{what}: pattern {pattern_code} is not served (1: residual + RMSNorm, "
                                    "2: + FP8 quant)")
        if scale_out is not None:
            raise InvalidInputError(f"{what}: scale_out (FP4 block scales) is not served")
        if rms_eps != self.fused.eps:
            raise InvalidInputError(f"{what}: eps {rms_eps} differs from the {self.fused.eps} set up")
        h = allreduce_in.shape[-1]
        x = allreduce_in.view(-1, h)
        res = residual.view(-1, h)
        if x.shape[0] > max_token_num:
            raise InvalidInputError(f"{what}: {x.shape[0]} tokens exceed max_token_num {max_token_num}")
        gemma = weight_bias == 1.0
        if pattern_code == PATTERN_RESIDUAL_RMSNORM_FP8:
            if quant_out is None or scale_factor is None:
                raise InvalidInputError(f"{what}: pattern 2 needs quant_out and scale_factor")
            # residual updated in place (or into allreduce_in when norm_out is given), FP8 rows out
            res_out = x if norm_out is not None else res
            self.fused(x, res, rms_gamma, gemma=gemma, fp8_scale=scale_factor.view(1),
                       out=quant_out.view(-1, h), residual_out=res_out)
            return
        if norm_out is None:
            self.fused(x, res, rms_gamma, gemma=gemma, out=x, residual_out=res)
        else:
            self.fused(x, res, rms_gamma, gemma=gemma, out=norm_out.view(-1, h), residual_out=x)

    def close(self) -> None:
        self.fused.close()


def make_device_communicator(base: type) -> type:
    """A subclass of ``base`` (vLLM's ``CudaCommunicator``, or anything with its constructor and
    ``all_reduce``/``destroy``) that serves TP all-reduces with tritoncomm."""

    class TritonCommCudaCommunicator(base):  # type: ignore[misc, valid-type]
        """vLLM's CUDA communicator with tritoncomm in front of its all-reduce (TP groups only)."""

        def __init__(self, cpu_group: Any, device: torch.device | None = None, device_group: Any = None,
                     unique_name: str = "") -> None:
            super().__init__(cpu_group, device, device_group, unique_name)
            self.tc_comm: TritonCommCustomAllreduce | None = None
            self.tc_fused: VllmFusedAllReduceNorm | None = None
            if "tp" in unique_name and self.world_size > 1:
                ca = TritonCommCustomAllreduce(self.cpu_group, self.device)
                self.tc_comm = None if ca.disabled else ca

        def setup_fused_allreduce_norm(self, max_token_num: int, hidden_size: int, eps: float = 1e-6) -> bool:
            """Collective: set up the fused entry (before graph capture). False when tritoncomm is off."""
            if self.tc_comm is None:
                return False
            self.tc_fused = VllmFusedAllReduceNorm(self.tc_comm.comm, max_token_num, hidden_size, eps)
            return True

        def fused_allreduce_norm(self, *args: Any, **kwargs: Any) -> None:
            """vLLM's ``flashinfer_trtllm_fused_allreduce_norm`` signature (see ``VllmFusedAllReduceNorm``)."""
            if self.tc_fused is None:
                raise InvalidInputError("fused all-reduce + RMSNorm is not set up on this communicator "
                                        "(setup_fused_allreduce_norm returned False or was not called)")
            self.tc_fused(*args, **kwargs)

        def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
            tc = self.tc_comm
            if tc is not None and tc.should_custom_ar(input_):
                out = tc.custom_all_reduce(input_)
                if out is not None:
                    return out
            return super().all_reduce(input_)

        def destroy(self) -> None:
            if self.tc_fused is not None:
                self.tc_fused.close()
                self.tc_fused = None
            if self.tc_comm is not None:
                self.tc_comm.close()
                self.tc_comm = None
            super().destroy()

    TritonCommCudaCommunicator.__qualname__ = f"TritonComm{base.__name__}"
    return TritonCommCudaCommunicator


@functools.cache
def _vllm_subclass() -> type:
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    return make_device_communicator(CudaCommunicator)


def __getattr__(name: str) -> Any:
    if name == "TritonCommCudaCommunicator":  # needs vLLM installed
        return _vllm_subclass()
    raise AttributeError(name)
