"""Collective algorithms written with the public primitives of ``tritoncomm.kernels``.

One family per package (``allreduce``, ``allgather`` with reduce-scatter, ``fused_norm``, ``gemm``,
``moe`` for expert-parallel dispatch and combine),
one kernel and its launcher per module; the shared selection (``selection``), validation
(``validation``) and base classes (``base``) beside them.
"""

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .allgather import AllGather, AllToAll, ReduceScatter
    from .allreduce import ALGORITHMS, AllReduce
    from .base import Algorithm, CollectiveBase, PeerOutput, Workspace
    from .defaults import default_table, load_table
    from .fused_norm import FUSED_ALGORITHMS, FUSED_ALGOS, MAX_HIDDEN, FusedAllReduceAddRMSNorm
    from .gemm import GEMM_PATHS, GemmAllReduce, GemmConfig
    from .moe import MoEAllToAll, MoEHandle
    from .selection import Choice, SelectionTable, read_table
    from .validation import SUPPORTED_DTYPES, SUPPORTED_OPS

# Each family imports (and defines its kernels) when it is first used (``lazy``).
__getattr__, __dir__ = lazy.exports(__name__, {
    ".allgather": ["AllGather", "AllToAll", "ReduceScatter"],
    ".allreduce": ["ALGORITHMS", "AllReduce"],
    ".base": ["Algorithm", "CollectiveBase", "PeerOutput", "Workspace"],
    ".fused_norm": ["FUSED_ALGORITHMS", "FUSED_ALGOS", "MAX_HIDDEN", "FusedAllReduceAddRMSNorm"],
    ".gemm": ["GEMM_PATHS", "GemmAllReduce", "GemmConfig"],
    ".moe": ["MoEAllToAll", "MoEHandle"],
    ".defaults": ["default_table", "load_table"],
    ".selection": ["Choice", "SelectionTable", "read_table"],
    ".validation": ["SUPPORTED_DTYPES", "SUPPORTED_OPS"],
})

__all__ = [
    "ALGORITHMS", "FUSED_ALGORITHMS", "FUSED_ALGOS", "GEMM_PATHS", "MAX_HIDDEN", "SUPPORTED_DTYPES", "SUPPORTED_OPS",
    "Algorithm", "AllGather", "AllReduce", "AllToAll", "Choice", "CollectiveBase", "FusedAllReduceAddRMSNorm",
    "GemmAllReduce", "GemmConfig", "MoEAllToAll", "MoEHandle", "PeerOutput", "ReduceScatter", "SelectionTable",
    "Workspace", "default_table", "load_table", "read_table",
]
