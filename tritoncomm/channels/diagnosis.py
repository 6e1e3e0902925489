"""What a communicator's diagnostic record (``kernels.diag``) means, as the error it raises: a mismatch
found by debug mode or by a kernel's call check, or a wait that gave up (with where its address lies in
the symmetric heap)."""

from __future__ import annotations

from ..errors import CollectiveMismatchError, CommTimeoutError, TritonCommError
from ..kernels.barrier import KIND_SIGNATURE
from ..kernels.consistency import SIGNATURE_FIELDS, code_name, describe_signature
from ..kernels.diag import KIND_NAMES, F
from ..kernels.lamport import KIND_LAMPORT
from .heap import SymmetricHeap

__all__ = ["heap_place", "recorded_error"]


def recorded_error(words: list[int], timeout_s: float, heap: SymmetricHeap) -> TritonCommError | None:
    """The error a diagnostic record (``kernels.diag``) holds, or None for a clean (or half-written) one;
    ``timeout_s`` and ``heap`` (where a Lamport wait's address lies) name what a timeout waited for."""
    status = words[F.STATUS]
    if status == 0 or (status == -1 and not any(words[1:])):
        return None
    if status == 3:  # debug mode's check, before the collective ran
        slot = words[F.SLOT]
        field = SIGNATURE_FIELDS[slot] if 0 <= slot < len(SIGNATURE_FIELDS) else str(slot)
        mine, theirs = code_name(slot, words[F.EXPECTED]), code_name(slot, words[F.SEEN])
        return CollectiveMismatchError(
            f"tritoncomm debug: rank {words[F.RANK]} and rank {words[F.PEER]} called different collectives: "
            f"{field} {mine} here, {theirs} there",
            rank=words[F.RANK], peer=words[F.PEER], field=field, mine=words[F.EXPECTED], theirs=words[F.SEEN])
    if status == KIND_SIGNATURE.value:  # a barrier's signature check: no output written
        mine, theirs = describe_signature(words[F.EXPECTED]), describe_signature(words[F.SEEN])
        return CollectiveMismatchError(
            f"tritoncomm: rank {words[F.RANK]} and rank {words[F.PEER]} called different collectives: "
            f"{mine} here, {theirs} there (barrier slot {words[F.SLOT]}). No output was written; this "
            "communicator is no longer usable.",
            rank=words[F.RANK], peer=words[F.PEER], field="signature", mine=words[F.EXPECTED],
            theirs=words[F.SEEN])
    return _timeout_error(words, timeout_s, heap)


def _timeout_error(words: list[int], timeout_s: float, heap: SymmetricHeap) -> CommTimeoutError:
    """The ``CommTimeoutError`` of a diagnostic record that holds a timeout."""
    status = words[F.STATUS]
    kind = KIND_NAMES.get(status, f"wait kind {status}")
    what = (f"{words[F.SEEN]} elements still at the sentinel{heap_place(heap, words[F.EXPECTED])}"
            if status == KIND_LAMPORT.value else f"expected epoch {words[F.EXPECTED]}, saw {words[F.SEEN]}")
    return CommTimeoutError(
        f"tritoncomm: {kind} timed out on rank {words[F.RANK]} waiting for peer {words[F.PEER]} "
        f"(slot {words[F.SLOT]}, program {words[F.PROGRAM]}): {what} "
        f"after {words[F.SPINS]} spins (limit {timeout_s:g} s). "
        "The peer is dead, hung, or ran a different sequence of collectives; this communicator is "
        "no longer usable.",
        rank=words[F.RANK], peer=words[F.PEER], slot=words[F.SLOT], expected=words[F.EXPECTED],
        seen=words[F.SEEN], kind=kind, program=words[F.PROGRAM])


def heap_place(heap: SymmetricHeap, addr: int) -> str:
    """Where a kernel's address lies: " (from byte B of <buffer tag> at heap offset O of rank R)", or ""."""
    for peer, base in enumerate(heap.memory.peer_addrs):
        if base <= addr < base + heap.nbytes:
            off = addr - base
            for r in heap.allocator.live:
                if r.offset <= off < r.offset + r.nbytes:
                    return f" (from byte {off - r.offset} of {r.tag} at heap offset {r.offset} of rank {peer})"
            return f" (heap offset {off} of rank {peer}, in no live buffer)"
    return ""
