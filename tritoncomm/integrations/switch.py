"""The switch the engine plugins share: installed, they stay inactive until ``TRITONCOMM_ENABLE=1``."""

from __future__ import annotations

import os

__all__ = ["AGRS_ENV", "ENABLE_ENV", "FUSION_ENV", "MOE_ENV", "agrs_enabled", "enabled", "fusion_enabled",
           "moe_enabled"]

#: The variable that turns the engine plugins on.
ENABLE_ENV = "TRITONCOMM_ENABLE"
#: ``0`` keeps the plugins off the engines' fused all-reduce + RMSNorm (on by default once enabled).
FUSION_ENV = "TRITONCOMM_FUSION"
#: ``1`` lets the plugins also take the engines' expert-parallel all-to-all (off by default).
MOE_ENV = "TRITONCOMM_MOE"
#: ``0`` keeps the plugins off vLLM's data-parallel all-gather + reduce-scatter MoE path (on by default once enabled).
AGRS_ENV = "TRITONCOMM_AGRS"

_TRUE = ("1", "true", "yes", "on")


def enabled() -> bool:
    """Whether ``TRITONCOMM_ENABLE`` asks the engine plugins to take over."""
    return os.environ.get(ENABLE_ENV, "0").strip().lower() in _TRUE


def fusion_enabled() -> bool:
    """Whether the plugins also serve the fused all-reduce + residual + RMSNorm (``TRITONCOMM_FUSION``)."""
    return os.environ.get(FUSION_ENV, "1").strip().lower() in _TRUE


def moe_enabled() -> bool:
    """Whether the plugins also serve the expert-parallel MoE all-to-all (``TRITONCOMM_MOE``)."""
    return os.environ.get(MOE_ENV, "0").strip().lower() in _TRUE


def agrs_enabled() -> bool:
    """Whether the plugins also serve vLLM's data-parallel all-gather + reduce-scatter (``TRITONCOMM_AGRS``)."""
    return os.environ.get(AGRS_ENV, "1").strip().lower() in _TRUE
