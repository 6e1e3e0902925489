"""The switch the engine plugins share: installed, they stay inactive until ``TRITONCOMM_ENABLE=1``."""

from __future__ import annotations

from .. import settings

__all__ = ["AGRS_ENV", "ENABLE_ENV", "FUSION_ENV", "MOE_ENV", "agrs_enabled", "enabled", "fusion_enabled",
           "moe_enabled"]

#: The variable that turns the engine plugins on.
ENABLE_ENV = settings.ENABLE.name
#: ``0`` keeps the plugins off the engines' fused all-reduce + RMSNorm (on by default once enabled).
FUSION_ENV = settings.FUSION.name
#: ``1`` lets the plugins also take the engines' expert-parallel all-to-all (off by default).
MOE_ENV = settings.MOE.name
#: ``0`` keeps the plugins off vLLM's data-parallel all-gather + reduce-scatter MoE path (on by default once enabled).
AGRS_ENV = settings.AGRS.name



def enabled() -> bool:
    """Whether ``TRITONCOMM_ENABLE`` asks the engine plugins to take over."""
    return bool(settings.ENABLE.get())


def fusion_enabled() -> bool:
    """Whether the plugins also serve the fused all-reduce + residual + RMSNorm (``TRITONCOMM_FUSION``)."""
    return bool(settings.FUSION.get())


def moe_enabled() -> bool:
    """Whether the plugins also serve the expert-parallel MoE all-to-all (``TRITONCOMM_MOE``)."""
    return bool(settings.MOE.get())


def agrs_enabled() -> bool:
    """Whether the plugins also serve vLLM's data-parallel all-gather + reduce-scatter (``TRITONCOMM_AGRS``)."""
    return bool(settings.AGRS.get())
