"""Collective algorithms written with the public primitives of ``tritoncomm.kernels``."""

from .allreduce import ALGORITHMS, AllReduce, AllReduceLaunch
from .validation import SUPPORTED_DTYPES, SUPPORTED_OPS

__all__ = ["ALGORITHMS", "AllReduce", "AllReduceLaunch", "SUPPORTED_DTYPES", "SUPPORTED_OPS"]
