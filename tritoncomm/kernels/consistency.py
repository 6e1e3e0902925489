"""Debug mode: do all ranks call the same collective with the same arguments?

``check_signatures`` runs as a tiny kernel before a collective. Every rank writes its signature
(four int64 words, e.g. op, dtype, element count, algorithm) into slot [my rank] of every rank's
table, meets them at a barrier, and compares every rank's signature with its own. The first
difference is recorded in the diagnostic record as kind 3 (``slot`` = the differing word,
``expected`` = mine, ``seen`` = the peer's); since every rank compares all signatures, every rank
finds the mismatch. Tables alternate by epoch parity, like one-shot staging.

The words' vocabulary (``OP_CODES``, ``DTYPE_CODES``) lives here too, so that the host turns a
recorded mismatch back into names with the same tables that made the signature.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import MAX_WORLD
from .barrier import barrier
from .diag import record_timeout
from .memory import address_ptr, heap_ptr
from .signals import epoch_commit, epoch_next

__all__ = ["DTYPE_CODES", "FALLBACK_CODE", "OP_CODES", "SIGNATURE_FIELDS", "SIGNATURE_WORDS", "check_signatures",
           "code_name", "describe_signature", "pack_signature", "signature_table_bytes"]

SIGNATURE_WORDS = tl.constexpr(4)
KIND_MISMATCH = tl.constexpr(3)
#: What each signature word holds.
SIGNATURE_FIELDS = ("op", "dtype", "element count", "algorithm")
#: Word 0: the collective.
OP_CODES = {"allreduce": 1, "allgather": 2, "reducescatter": 3, "fused_add_rmsnorm": 4, "gemm_allreduce": 5,
            "alltoall": 6, "moe_dispatch": 7, "moe_combine": 8}
#: Word 1: the element type.
DTYPE_CODES = {"bf16": 1, "fp16": 2, "fp32": 3}
#: Word 3's low byte when the call goes to the fallback group (algorithms are numbered from 1 by their
#: collective's registry).
FALLBACK_CODE = 99


def code_name(field: int, value: int) -> str:
    """``value`` of signature word ``field`` as a person reads it (``"allreduce"``, ``"bf16"``, a number)."""
    names = {0: OP_CODES, 1: DTYPE_CODES}.get(field)
    if names is None:
        return str(value)
    return next((n for n, c in names.items() if c == value), str(value))


#: Bits of each field in a packed signature (``pack_signature``), low to high; the count takes the rest
#: below bit 62, which is always set (the kernels then take it as an int64 at every size).
_OP_BITS, _DTYPE_BITS, _ALGO_BITS = 6, 4, 8
_COUNT_SHIFT = _OP_BITS + _DTYPE_BITS + _ALGO_BITS
_COUNT_MAX = (1 << (62 - _COUNT_SHIFT)) - 1
_MARK = 1 << 62


def pack_signature(op: int, dtype: int, count: int, algo: int) -> int:
    """One int64 that names a call (the always-on check at barriers, ``kernels.barrier``): the op and
    dtype codes, the algorithm's code (its low 8 bits) and the element count (modulo 2**44)."""
    fields = op | dtype << _OP_BITS | (algo & 0xFF) << (_OP_BITS + _DTYPE_BITS)
    return _MARK | fields | (count & _COUNT_MAX) << _COUNT_SHIFT


def describe_signature(sig: int) -> str:
    """A packed signature as a person reads it: ``"allreduce bf16 x 1024, algorithm 3"``."""
    op = sig & ((1 << _OP_BITS) - 1)
    dtype = sig >> _OP_BITS & ((1 << _DTYPE_BITS) - 1)
    algo = sig >> (_OP_BITS + _DTYPE_BITS) & 0xFF
    count = sig >> _COUNT_SHIFT & _COUNT_MAX
    algo_name = "fallback" if algo == FALLBACK_CODE else f"algorithm {algo}"
    return f"{code_name(0, op)} {code_name(1, dtype)} x {count}, {algo_name}"


def signature_table_bytes() -> int:
    """Heap bytes the signature table needs (two parities x MAX_WORLD x 4 int64)."""
    return 2 * MAX_WORLD.value * SIGNATURE_WORDS.value * 8


@triton.jit(do_not_specialize=["rank"])  # one compiled kernel for every rank
def check_signatures(w0, w1, w2, w3, bases, rank, world, timeout, diag_addr, flags_off, epochs_off, table_off):
    diag = address_ptr(diag_addr, tl.int64)
    ep = heap_ptr(bases, rank, epochs_off, tl.uint32)
    e = epoch_next(ep)
    base = table_off + (e & 1).to(tl.int64) * (MAX_WORLD * SIGNATURE_WORDS * 8)
    k = tl.arange(0, SIGNATURE_WORDS)
    mine = tl.where(k == 0, w0, tl.where(k == 1, w1, tl.where(k == 2, w2, w3))).to(tl.int64)
    for p in range(0, world):
        tl.store(heap_ptr(bases, p, base + rank * SIGNATURE_WORDS * 8, tl.int64) + k, mine)
    barrier(bases, rank, world, flags_off, 0, e, timeout, diag)
    for p in range(0, world):
        theirs = tl.load(heap_ptr(bases, rank, base + p * SIGNATURE_WORDS * 8, tl.int64) + k)
        differ = theirs != mine
        if tl.sum(differ.to(tl.int32), axis=0) > 0:
            first = tl.min(tl.where(differ, k, SIGNATURE_WORDS), axis=0)
            record_timeout(diag, KIND_MISMATCH, rank, p, first, tl.sum(tl.where(k == first, mine, 0), axis=0),
                           tl.sum(tl.where(k == first, theirs, 0), axis=0), 0)
    epoch_commit(ep, e)
