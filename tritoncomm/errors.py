"""Exceptions raised by tritoncomm. All derive from ``TritonCommError``."""

from __future__ import annotations

__all__ = [
    "CollectiveMismatchError",
    "CommTimeoutError",
    "InvalidInputError",
    "PeerAccessError",
    "SetupMismatchError",
    "TritonCommError",
]


class TritonCommError(RuntimeError):
    """Base class of every tritoncomm error."""


class InvalidInputError(TritonCommError, ValueError):
    """A collective was called with input it cannot serve (raised before any rank waits)."""


class PeerAccessError(TritonCommError):
    """The ranks of a group cannot map each other's memory (no peer access, or not one node)."""


class SetupMismatchError(TritonCommError):
    """Ranks disagreed during set-up (different heap layouts, world sizes, configs, ...)."""


class CommTimeoutError(TritonCommError):
    """A bounded wait inside a kernel expired: a peer is dead, hung or running other work.

    ``rank``, ``peer``, ``slot``, ``expected`` and ``seen`` come from the kernel's diagnostic
    record (for a Lamport poll, ``expected`` is the address of the first element still missing and
    ``seen`` how many were). The communicator is unusable afterwards (ranks' epochs may disagree):
    destroy it.
    """

    def __init__(self, message: str, *, rank: int, peer: int, slot: int, expected: int, seen: int,
                 kind: str, program: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.slot = slot
        self.expected = expected
        self.seen = seen
        self.kind = kind
        self.program = program


class CollectiveMismatchError(TritonCommError):
    """The ranks called a collective with different arguments (op, dtype, element count or algorithm).

    Debug mode checks every call before it runs: raised on every rank at the call, the communicator
    stays usable; ``field`` names the first differing word, ``mine``/``theirs`` its values here and
    on ``peer``. Without debug mode the collectives' barriers compare every call's signature: the
    call writes no output, the error surfaces as a timeout does (``Communicator.check``), with
    ``field`` "signature" and ``mine``/``theirs`` the packed signatures, and the communicator is
    unusable afterwards."""

    def __init__(self, message: str, *, rank: int, peer: int, field: str, mine: int, theirs: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.field = field
        self.mine = mine
        self.theirs = theirs
