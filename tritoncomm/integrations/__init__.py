"""Integrations, built on ``collectives``: the torch.distributed backend (``backend``; registered by
``tritoncomm.distributed``), the torch-style API with its custom ops (``torch_api``), the engines' custom
all-reduce slot (``custom_allreduce``) and one module per engine with its plugin (``vllm`` and its
compiled-graph fusion pass ``vllm_fusion``, which imports vLLM; ``sglang``), tensor-parallel layers (``tp``),
the expert-parallel MoE layer (``ep``), hierarchical (multi-node) all-reduce (``hierarchical``), and what they
share: the capability probe (``capability``) and the plugins' switch (``switch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .capability import Verdict, probe
    from .custom_allreduce import CustomAllReduceSlot
    from .ep import ExpertParallelMoE, moe_reference
    from .hierarchical import HierarchicalAllReduce, NodeGroups, node_groups
    from .sglang import SGLangCustomAllreduce
    from .torch_api import (
        GroupCollectives,
        Registry,
        all_gather_into_tensor,
        all_reduce,
        all_to_all_single,
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

# Each engine's module imports only when it is used (``lazy``); ``torch_api`` registers the tritoncomm::
# custom ops with torch.library when it is first imported.
__getattr__, __dir__ = lazy.exports(__name__, {
    ".capability": ["Verdict", "probe"],
    ".custom_allreduce": ["CustomAllReduceSlot"],
    ".ep": ["ExpertParallelMoE", "moe_reference"],
    ".hierarchical": ["HierarchicalAllReduce", "NodeGroups", "node_groups"],
    ".sglang": ["SGLangCustomAllreduce"],
    ".torch_api": ["GroupCollectives", "Registry", "all_gather_into_tensor", "all_reduce", "all_to_all_single",
        "default_registry", "reduce_scatter_tensor", "shutdown"],
    ".tp": ["ColumnParallelLinear", "FusedAddRMSNorm", "LlamaDecoderLayer", "MergedColumnParallelLinear",
        "RowParallelLinear", "TorchReducer", "TritonCommReducer", "VocabParallelEmbedding"],
    ".vllm": ["TritonCommCustomAllreduce"],
})

__all__ = [
    "ColumnParallelLinear", "CustomAllReduceSlot", "ExpertParallelMoE", "FusedAddRMSNorm", "GroupCollectives",
    "HierarchicalAllReduce", "LlamaDecoderLayer", "MergedColumnParallelLinear", "NodeGroups", "Registry",
    "RowParallelLinear", "SGLangCustomAllreduce", "TorchReducer", "TritonCommCustomAllreduce", "TritonCommReducer",
    "Verdict", "VocabParallelEmbedding", "all_gather_into_tensor", "all_reduce", "all_to_all_single",
    "default_registry", "moe_reference", "node_groups", "probe", "reduce_scatter_tensor", "shutdown",
]
