"""Can tritoncomm serve this group? One collective vote, the same answer on every rank.

Each rank checks what it can see locally (a backend, peer access to every other rank's device, one
host, a supported world size, free device memory for the heap); the ranks exchange their findings
over the CPU group and every rank adopts the first reason anyone found. The probe never raises for
an unsuitable group and never exits: callers fall back to NCCL and log ``reason`` once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..channels import GroupBootstrap
from ..channels.bootstrap import Bootstrap
from ..channels.topology import local_peer_access, rank_info
from ..config import CommConfig
from ..kernels.backend import MAX_WORLD, interpreting

__all__ = ["Verdict", "has_cuda_bindings", "probe"]

log = logging.getLogger("tritoncomm")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""

    def log_once(self, what: str = "tritoncomm") -> None:
        if not self.ok:
            log.warning("%s disabled because %s", what, self.reason)


def has_cuda_bindings() -> bool:
    """Whether cuda-python's ``cuda.bindings`` (CUDA IPC, mapped host memory) can be imported."""
    import importlib.util

    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):  # no ``cuda`` package at all, or a broken one
        return False


def _local_backend(device: torch.device | None) -> tuple[str | None, str]:
    if interpreting():
        return "cpu", ""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        if not has_cuda_bindings():
            return None, "cuda-python is not installed (pip install 'tritoncomm[gpu]'): CUDA IPC needs cuda.bindings"
        return "cuda", ""
    return None, "no CUDA device and not in the CPU world (TRITON_INTERPRET=1)"


def probe(cpu_group: dist.ProcessGroup | None, device: torch.device | None, config: CommConfig | None = None, *,
          bootstrap: Bootstrap | None = None) -> Verdict:
    """Collective over ``cpu_group`` (gloo), or over ``bootstrap`` when given. See the module docstring."""
    config = config or CommConfig()
    boot = bootstrap or GroupBootstrap(cpu_group)
    world, rank = boot.world, boot.rank
    backend, why = _local_backend(device)
    heap = config.resolved_heap_bytes(backend or "cuda")
    if not why and world > MAX_WORLD.value:
        why = f"world size {world} exceeds {MAX_WORLD.value}"
    if not why and world < 2:
        why = "a group of one rank needs no communication"
    if not why and backend == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if free < heap + (256 << 20):
            why = f"rank {rank} has {free >> 20} MiB free, the heap needs {heap >> 20} MiB"
    info = rank_info(backend or "cpu", device if backend == "cuda" else torch.device("cpu")) if not why else None
    infos = boot.all_gather((info, why))
    first = next((w for _, w in infos if w), "")
    if not first:
        all_infos = [i for i, _ in infos]
        row = local_peer_access(backend, device if backend == "cuda" else torch.device("cpu"), all_infos, rank,
                                shared_gpus=config.shared_gpus)
        mine = next((f"rank {rank} -> rank {r}: {w}" for r, w in enumerate(row) if w), "")
        first = next((w for w in boot.all_gather(mine) if w), "")
    return Verdict(not first, first)
