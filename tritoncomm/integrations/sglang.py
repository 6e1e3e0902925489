"""SGLang: a drop-in for its custom all-reduce, which its ``GroupCoordinator`` calls through
``ca_comm`` (SGLang's ``custom_all_reduce.py`` keeps vLLM's contract, adapted; see ``vllm``)."""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from .vllm import TritonCommCustomAllreduce

__all__ = ["SGLangCustomAllreduce"]


class SGLangCustomAllreduce(TritonCommCustomAllreduce):
    """SGLang's ``CustomAllreduce`` contract (the same methods; SGLang's default max size)."""

    def __init__(self, group: ProcessGroup, device: int | str | torch.device, max_size: int = 8192 * 1024) -> None:
        super().__init__(group, device, max_size=max_size)
