"""Integrations, built on ``collectives``: the torch-style API with its custom ops (``torch_api``),
one module per engine (``vllm``, ``sglang``), tensor-parallel layers (``tp``), hierarchical
(multi-node) all-reduce (``hierarchical``) and the capability probe they share (``capability``)."""

from .capability import Verdict, probe
from .hierarchical import HierarchicalAllReduce, NodeGroups, node_groups
from .sglang import SGLangCustomAllreduce
from .torch_api import (  # importing it registers the tritoncomm:: custom ops with torch.library
    GroupCollectives,
    Registry,
    all_gather_into_tensor,
    all_reduce,
    default_registry,
    reduce_scatter_tensor,
    shutdown,
)
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
from .vllm import TritonCommCustomAllreduce

__all__ = [
    "ColumnParallelLinear", "FusedAddRMSNorm", "GroupCollectives", "HierarchicalAllReduce", "LlamaDecoderLayer",
    "MergedColumnParallelLinear", "NodeGroups", "Registry", "RowParallelLinear", "SGLangCustomAllreduce",
    "TorchReducer", "TritonCommCustomAllreduce", "TritonCommReducer", "Verdict", "VocabParallelEmbedding",
    "all_gather_into_tensor", "all_reduce", "default_registry", "node_groups", "probe", "reduce_scatter_tensor",
    "shutdown",
]
