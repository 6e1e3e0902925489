"""Drop-in all-reduce for inference engines, shaped like their custom all-reduce contracts.

Written against the published source of:

* vLLM ``vllm/distributed/device_communicators/custom_all_reduce.py`` (main, commit 00d618aa,
  2026-11): ``CustomAllreduce(group, device, max_size=8192 * 1024, symm_mem_enabled=False)`` with
  ``disabled``, ``should_custom_ar(inp)``, ``all_reduce(inp, *, out=None, registered=False)``,
  ``custom_all_reduce(input) -> Tensor | None``, ``capture()``, ``finalize_p2p()``, ``close()``;
* SGLang ``python/sglang/srt/distributed/device_communicators/custom_all_reduce.py`` (the same
  contract, adapted from vLLM), which its ``GroupCoordinator`` calls through ``ca_comm``.

``group`` is the engine's CPU (gloo) group, as in both engines. A capability probe decides, by one
vote on that group, whether tritoncomm serves it; if not, ``disabled`` is True, one line
``tritoncomm disabled because ...`` is logged, ``custom_all_reduce`` returns None and the engine
falls back to NCCL, exactly as with its own custom all-reduce. Nothing here exits or hangs.

Every launch is graph-safe without registration. ``capture()``, which both engines wrap around
all their graph captures, also registers the captured all-reduce outputs on exit
(``Communicator.graph_capture``), as the engines' own kernels do with their graph buffers: the
two-shot then writes peers' outputs directly instead of copying out of the heap. Graphs captured
inside are replayed after it exits, as both engines do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed import ProcessGroup

from ..channels import Communicator
from ..collectives import AllReduce
from ..collectives.validation import SUPPORTED_DTYPES
from .capability import probe

__all__ = ["SGLangCustomAllreduce", "TritonCommCustomAllreduce"]


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


class SGLangCustomAllreduce(TritonCommCustomAllreduce):
    """SGLang's ``CustomAllreduce`` contract (the same methods; SGLang's default max size)."""

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, max_size: int = 8192 * 1024) -> None:
        super().__init__(group, device, max_size=max_size)
