"""Topology: which ranks may map each other's memory, decided from what every rank reports."""

from __future__ import annotations

import torch

from tritoncomm.channels.topology import RankInfo, local_peer_access
from tritoncomm.config import SHARED_GPUS_ENV, CommConfig


def _two_ranks_on_one_gpu() -> list[RankInfo]:
    return [RankInfo("host", "cuda", "0000:19:00.0"), RankInfo("host", "cuda", "0000:19:00.0")]


def test_ranks_sharing_a_gpu_are_refused_unless_allowed():
    infos, dev = _two_ranks_on_one_gpu(), torch.device("cuda", 0)
    refused = local_peer_access("cuda", dev, infos, 0)
    assert refused[0] is None and "shares GPU 0000:19:00.0" in refused[1] and "shared_gpus" in refused[1]
    assert local_peer_access("cuda", dev, infos, 1, shared_gpus=True) == [None, None]


def test_other_hosts_stay_refused_with_shared_gpus():
    infos = [RankInfo("a", "cuda", "0000:19:00.0"), RankInfo("b", "cuda", "0000:19:00.0")]
    row = local_peer_access("cuda", torch.device("cuda", 0), infos, 0, shared_gpus=True)
    assert row[0] is None and "another host" in row[1]


def test_shared_gpus_follows_the_environment(monkeypatch):
    monkeypatch.delenv(SHARED_GPUS_ENV, raising=False)
    assert CommConfig().shared_gpus is False
    monkeypatch.setenv(SHARED_GPUS_ENV, "1")
    assert CommConfig().shared_gpus is True and CommConfig(shared_gpus=False).shared_gpus is False
