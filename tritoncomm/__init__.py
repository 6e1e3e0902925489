"""tritoncomm: GPU communication for LLM inference, in Python and Triton.

* ``tritoncomm.kernels``: device primitives (put/get, signal/wait, barrier, LL packets);
* ``tritoncomm.channels``: symmetric heaps, communicators and channels;
* ``tritoncomm.collectives``: all-reduce and friends, MoE dispatch/combine, built on the primitives;
* ``tritoncomm.launch``: start N local ranks (GPUs, or the CPU world);
* ``tritoncomm.distributed``: the ``"tritoncomm"`` torch.distributed backend, registered on import.
"""

from . import distributed  # noqa: F401  (registers the "tritoncomm" torch.distributed backend)
from .channels import Channel, Communicator
from .collectives import AllGather, AllReduce, AllToAll, MoEAllToAll, ReduceScatter
from .config import CommConfig
from .errors import (
    CollectiveMismatchError,
    CommTimeoutError,
    InvalidInputError,
    PeerAccessError,
    SetupMismatchError,
    TritonCommError,
)

__version__ = "0.1.0"

__all__ = [
    "AllGather", "AllReduce", "AllToAll", "Channel", "CollectiveMismatchError", "CommConfig", "CommTimeoutError",
    "Communicator", "InvalidInputError", "MoEAllToAll",
    "PeerAccessError", "ReduceScatter", "SetupMismatchError", "TritonCommError", "__version__",
]
