"""The ``"tritoncomm"`` torch.distributed backend's name and registration, kept apart from the backend
itself (``integrations.backend``) so that ``import tritoncomm`` registers it without importing Triton or
any kernel: ``dist.init_process_group("cpu:gloo,cuda:tritoncomm")`` works right after the import, and
the backend's modules load when the first group is created."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .config import BACKEND

__all__ = ["BACKEND", "register"]


def register() -> None:
    """Register the backend with torch.distributed (idempotent; ``import tritoncomm`` does it)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def _create(opts: Any, backend_options: Any) -> Any:
    from .integrations.backend import create_process_group

    return create_process_group(opts, backend_options)
