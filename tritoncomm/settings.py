"""Every ``TRITONCOMM_*`` environment variable: declared once, with its type, default and meaning, and read
through one parser (``Setting.get``). ``docs/settings.md`` lists them (``table``; a test keeps it in step).

Booleans take ``1``/``true``/``yes``/``on`` and ``0``/``false``/``no``/``off`` (any case); anything else
raises ``ValueError`` naming the variable. An unset or empty variable gives the default. Each read looks
at the environment afresh: nothing is cached here (a kernel constant read at import, like
``BARRIER_ALL_WARPS``, says so in its meaning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "ABORT_ON_TIMEOUT", "AGRS", "BACKEND_MAX_BYTES", "BARRIER_ALL_WARPS", "BENCH_DUMP_S", "BENCH_PROFILE",
    "BENCH_STATIC", "CHECK_CALLS", "ENABLE", "FUSION", "MOE", "SETTINGS", "SHARED_GPUS", "Setting", "TorchrunEnv",
    "local_world_size", "table", "torchrun_env", "triton_interprets", "vllm_batch_invariant",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``name``, its type (``bool``, ``int`` or ``float``), ``default`` (None:
    unset means "not given") and what it does."""

    name: str
    kind: type
    default: bool | int | float | None
    meaning: str

    def get(self) -> bool | int | float | None:
        """The variable's value now, parsed, or the default where it is unset or empty."""
        raw = os.environ.get(self.name, "").strip()
        if not raw:
            return self.default
        if self.kind is bool:
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"{self.name}={raw!r}: expected one of {_TRUE + _FALSE}")
        try:
            return self.kind(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r}: expected a {self.kind.__name__}") from None


ENABLE = Setting("TRITONCOMM_ENABLE", bool, False, "the engine plugins (vLLM, SGLang) take over their communication")
FUSION = Setting("TRITONCOMM_FUSION", bool, True, "with the plugins on: also the engines' fused all-reduce + "
                 "add + RMSNorm (+ FP8)")
MOE = Setting("TRITONCOMM_MOE", bool, False, "with the plugins on: also the engines' expert-parallel all-to-all")
AGRS = Setting("TRITONCOMM_AGRS", bool, True, "with the plugins on: also vLLM's data-parallel all-gather + "
               "reduce-scatter MoE path")
SHARED_GPUS = Setting("TRITONCOMM_SHARED_GPUS", bool, False, "default of `CommConfig.shared_gpus`: ranks may share "
                      "a GPU (time-sliced: correctness only, never speed)")
ABORT_ON_TIMEOUT = Setting("TRITONCOMM_ABORT_ON_TIMEOUT", bool, False, "default of `CommConfig.abort_on_timeout`: "
                           "the watchdog ends the process once it has logged a timeout")
CHECK_CALLS = Setting("TRITONCOMM_CHECK_CALLS", bool, True, "default of `CommConfig.check_calls`: the barriers "
                      "compare every call's signature (`docs/reliability.md`)")
BARRIER_ALL_WARPS = Setting("TRITONCOMM_BARRIER_ALL_WARPS", bool, False, "every warp of a program stores and polls "
                            "the barrier flags, not only the first (for comparisons; read once, at import)")
BACKEND_MAX_BYTES = Setting("TRITONCOMM_BACKEND_MAX_BYTES", int, None, "the torch.distributed backend's largest "
                            "served message per collective (default: per device kind, `integrations.backend`)")
BENCH_DUMP_S = Setting("TRITONCOMM_BENCH_DUMP_S", float, 240.0, "`bench --op backend`: seconds before a rank dumps "
                       "its threads' stacks (a hang's trace)")
BENCH_STATIC = Setting("TRITONCOMM_BENCH_STATIC", bool, True, "`bench --op backend`: also time the static-graph run")
BENCH_PROFILE = Setting("TRITONCOMM_BENCH_PROFILE", bool, False, "`bench --op backend`: rank 0 profiles where a "
                        "decode step's host time goes")

#: Every setting, in the order the docs list them.
SETTINGS = (ENABLE, FUSION, MOE, AGRS, SHARED_GPUS, ABORT_ON_TIMEOUT, CHECK_CALLS, BARRIER_ALL_WARPS,
            BACKEND_MAX_BYTES, BENCH_DUMP_S, BENCH_STATIC, BENCH_PROFILE)


# -- other programs' variables, read here by their owners' rules -------------------------------------------

def triton_interprets() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET``, by Triton's own rule:
    ``1``/``true``/``yes``/``on``/``y`` in any case; anything else is false)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y")


def vllm_batch_invariant() -> bool:
    """vLLM's ``VLLM_BATCH_INVARIANT`` by vLLM's rule (an integer, 0 when unset), for when vLLM's own
    ``envs`` module cannot be imported."""
    return bool(int(os.environ.get("VLLM_BATCH_INVARIANT", "0") or "0"))


@dataclass(frozen=True)
class TorchrunEnv:
    """What torchrun (or a launcher like it) tells each process: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
    (default: the rank) and ``LOCAL_WORLD_SIZE`` (default: the world)."""

    rank: int
    world: int
    local_rank: int
    local_world: int


def torchrun_env() -> TorchrunEnv:
    """This process's ``TorchrunEnv``; ``KeyError`` names ``RANK`` or ``WORLD_SIZE`` when unset."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return TorchrunEnv(rank, world, int(os.environ.get("LOCAL_RANK", rank)),
                       int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def local_world_size(default: int) -> int:
    """Ranks per node as torchrun gives them (``LOCAL_WORLD_SIZE``), or ``default`` where unset."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or default)


def table() -> str:
    """The settings as the Markdown table of ``docs/settings.md``."""
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = "unset" if s.default is None else (str(int(s.default)) if s.kind is bool else str(s.default))
        lines.append(f"| `{s.name}` | {s.kind.__name__} | {default} | {s.meaning} |")
    return "\n".join(lines)
