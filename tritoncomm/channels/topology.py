"""Can the ranks of a group map each other's memory? Decided once, at set-up, by every rank alike."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch

from .bootstrap import Bootstrap

__all__ = ["RankInfo", "check_topology", "local_peer_access", "rank_info"]


@dataclass(frozen=True)
class RankInfo:
    host: str
    backend: str
    device_id: str  # PCI bus id on CUDA, "cpu" in the CPU world


def rank_info(backend: str, device: torch.device) -> RankInfo:
    if backend == "cuda":
        from .cuda_ipc import cuda_check, runtime

        bus = cuda_check(runtime().cudaDeviceGetPCIBusId(32, device.index), "cudaDeviceGetPCIBusId")
        bus_id = bus.decode().rstrip("\x00") if isinstance(bus, bytes) else str(bus)
        return RankInfo(socket.gethostname(), backend, bus_id)
    return RankInfo(socket.gethostname(), backend, "cpu")


def local_peer_access(backend: str, device: torch.device, infos: list[RankInfo], rank: int, *,
                      shared_gpus: bool = False) -> list[str | None]:
    """For each rank, ``None`` if this rank can map its memory, else the reason it cannot. Ranks on
    the same GPU can (CUDA IPC between processes of one device), but are refused unless
    ``shared_gpus`` (``CommConfig.shared_gpus``: time-sliced, for correctness only)."""
    out: list[str | None] = []
    me = infos[rank]
    for r, info in enumerate(infos):
        if r == rank:
            out.append(None)
        elif info.host != me.host:
            out.append(f"on another host ({info.host})")
        elif info.backend != me.backend:
            out.append(f"uses backend {info.backend}")
        elif backend != "cuda":
            out.append(None)
        elif info.device_id == me.device_id:
            out.append(None if shared_gpus else f"shares GPU {me.device_id} (one GPU per rank; "
                       "CommConfig.shared_gpus allows it for correctness runs)")
        else:
            from .cuda_ipc import runtime

            rt = runtime()
            err, peer_index = rt.cudaDeviceGetByPCIBusId(info.device_id.encode())
            if err != rt.cudaError_t.cudaSuccess:
                out.append(f"its GPU {info.device_id} is not visible here")
                continue
            err, ok = rt.cudaDeviceCanAccessPeer(device.index, peer_index)
            out.append(None if err == rt.cudaError_t.cudaSuccess and ok else f"no peer access to GPU {info.device_id}")
    return out


def check_topology(bootstrap: Bootstrap, backend: str, device: torch.device, *,
                   shared_gpus: bool = False) -> list[RankInfo]:
    """Collective. Returns every rank's info, or raises ``PeerAccessError`` on every rank."""
    from ..errors import PeerAccessError

    infos = bootstrap.all_gather(rank_info(backend, device))
    verdicts = bootstrap.all_gather(local_peer_access(backend, device, infos, bootstrap.rank,
                                                        shared_gpus=shared_gpus))
    problems = [f"rank {a} -> rank {b}: {why}" for a, row in enumerate(verdicts) for b, why in enumerate(row)
                if why is not None and a != b]
    if problems:
        raise PeerAccessError("tritoncomm cannot serve this group: " + "; ".join(problems))
    return infos
