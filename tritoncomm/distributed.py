"""tritoncomm as a torch.distributed backend (``integrations.backend``).

Importing ``tritoncomm`` registers the backend ``"tritoncomm"`` (``registration``)::

    import torch, torch.distributed as dist, tritoncomm
    torch.cuda.set_device(local_rank)
    dist.init_process_group("cpu:gloo,cuda:tritoncomm")
    dist.all_reduce(x)          # tritoncomm's kernels; what it does not serve goes to NCCL
"""

from __future__ import annotations

from .integrations.backend import BACKEND, TritonCommProcessGroup, TritonCommWork, graph_capture
from .registration import register

__all__ = ["BACKEND", "TritonCommProcessGroup", "TritonCommWork", "graph_capture", "register"]

register()
