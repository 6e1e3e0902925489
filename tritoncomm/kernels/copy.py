"""put / get: vectorised copies between this rank's memory and a peer's heap.

A program copies ``n`` elements in blocks of ``BLOCK``. Pointers that come from ``heap_ptr`` are
marked 16-byte aligned and torch tensors are specialised as aligned by Triton, so unmasked blocks
compile to 16-byte accesses; the tail block is masked, so any ``n`` is valid.

Ordering contract: none. Both are plain (weak) loads and stores. A ``put``'s data is visible to a
peer only after this program ``signal``s and the peer ``wait``s on that signal; a ``get`` reads
valid data only after this program has ``wait``ed for the owner's signal that the data is ready,
and the owner may overwrite the source only after this program signals that it has finished.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["copy_block", "get", "put"]


@triton.jit
def copy_block(dst, src, offs, mask):
    """Copy one block: ``dst[offs] = src[offs]`` where ``mask``."""
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def put(dst, src, n, BLOCK: tl.constexpr):
    """This program copies ``n`` elements from local ``src`` to ``dst`` (a peer's heap)."""
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        copy_block(dst, src, offs, offs < n)


@triton.jit
def get(dst, src, n, BLOCK: tl.constexpr):
    """This program copies ``n`` elements from ``src`` (a peer's heap) to local ``dst``."""
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        copy_block(dst, src, offs, offs < n)
