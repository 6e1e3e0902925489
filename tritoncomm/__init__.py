"""tritoncomm: GPU communication for LLM inference, in Python and Triton.

* ``tritoncomm.kernels``: device primitives (put/get, signal/wait, barrier, LL packets);
* ``tritoncomm.channels``: symmetric heaps, communicators and channels;
* ``tritoncomm.collectives``: all-reduce and friends, MoE dispatch/combine, built on the primitives;
* ``tritoncomm.launch``: start N local ranks (GPUs, or the CPU world);
* ``tritoncomm.distributed``: the ``"tritoncomm"`` torch.distributed backend.

Importing the package registers the backend (``registration``) and nothing more: the names below load
their modules (and Triton) at first use (``lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lazy, registration
from .config import CommConfig
from .errors import (
    CollectiveMismatchError,
    CommTimeoutError,
    InvalidInputError,
    PeerAccessError,
    SetupMismatchError,
    TritonCommError,
)

if TYPE_CHECKING:
    from .channels import Channel, Communicator
    from .collectives import AllGather, AllReduce, AllToAll, MoEAllToAll, ReduceScatter

registration.register()

__version__ = "0.1.0"

__getattr__, __dir__ = lazy.exports(__name__, {
    ".channels": ["Channel", "Communicator", "channels"],
    ".collectives": ["AllGather", "AllReduce", "AllToAll", "MoEAllToAll", "ReduceScatter", "collectives"],
    ".distributed": ["distributed"], ".integrations": ["integrations"], ".kernels": ["kernels"], ".launch": ["launch"],
})

__all__ = [
    "AllGather", "AllReduce", "AllToAll", "Channel", "CollectiveMismatchError", "CommConfig", "CommTimeoutError",
    "Communicator", "InvalidInputError", "MoEAllToAll",
    "PeerAccessError", "ReduceScatter", "SetupMismatchError", "TritonCommError", "__version__",
]
