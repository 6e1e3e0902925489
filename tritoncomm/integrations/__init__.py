"""Integrations: torch.library ops, a torch.distributed-style API, engine adapters (vLLM, SGLang),
a capability probe, and hierarchical (multi-node) all-reduce. Built on ``collectives``."""

from . import ops  # registers the tritoncomm:: custom ops with torch.library
from .capability import Verdict, probe
from .engines import SGLangCustomAllreduce, TritonCommCustomAllreduce
from .functional import (
    GroupCollectives,
    Registry,
    all_gather_into_tensor,
    all_reduce,
    default_registry,
    reduce_scatter_tensor,
    shutdown,
)
from .hierarchical import HierarchicalAllReduce, NodeGroups, node_groups
from .tp import (
    ColumnParallelLinear,
    FusedAddRMSNorm,
    LlamaDecoderLayer,
    MergedColumnParallelLinear,
    RowParallelLinear,
    TorchReducer,
    TritonCommReducer,
    VocabParallelEmbedding,
)

__all__ = [
    "ColumnParallelLinear", "FusedAddRMSNorm", "LlamaDecoderLayer", "MergedColumnParallelLinear", "RowParallelLinear",
    "TorchReducer",
    "TritonCommReducer", "VocabParallelEmbedding",
    "GroupCollectives", "HierarchicalAllReduce", "NodeGroups", "Registry", "SGLangCustomAllreduce",
    "TritonCommCustomAllreduce", "Verdict", "all_gather_into_tensor", "all_reduce", "default_registry", "node_groups",
    "ops", "probe", "reduce_scatter_tensor", "shutdown",
]
