"""Collective algorithms written with the public primitives of ``tritoncomm.kernels``."""

from .allgather import AllGather, ReduceScatter
from .allreduce import ALGORITHMS, LL_MAX_BYTES, AllReduce
from .fused import FUSED_ALGOS, MAX_HIDDEN, FusedAllReduceAddRMSNorm
from .gemm_allreduce import GEMM_PATHS, GemmAllReduce, GemmConfig
from .tuning import Choice, SelectionTable, default_table, load_table
from .validation import SUPPORTED_DTYPES, SUPPORTED_OPS

__all__ = [
    "ALGORITHMS", "FUSED_ALGOS", "GEMM_PATHS", "LL_MAX_BYTES", "MAX_HIDDEN", "SUPPORTED_DTYPES", "SUPPORTED_OPS",
    "AllGather", "AllReduce", "Choice", "FusedAllReduceAddRMSNorm", "GemmAllReduce", "GemmConfig", "ReduceScatter",
    "SelectionTable", "default_table", "load_table",
]
