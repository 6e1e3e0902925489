"""Device-side primitives: ``@triton.jit`` functions to call from any Triton kernel.

The public surface (each module's docstring states its memory-ordering contract):

* addressing (``memory``): ``heap_base``, ``heap_ptr``, ``translate``, ``assume_multiple``, ``aligned_runs``,
  ``address_ptr``;
* data movement (``copy``): ``put``, ``get``, ``copy_block``;
* synchronisation (``signals``, ``barrier``): ``signal``, ``signal_add``, ``signal_relaxed``,
  ``wait``, ``wait_relaxed``, ``barrier`` (and its halves ``barrier_arrive``/``barrier_wait``),
  ``epoch_next``, ``epoch_commit``, ``epoch_commit_slots`` (a launch narrower than its channel);
* LL packets (``ll``): ``ll8_store``, ``ll8_try``, ``ll8_poll``, ``ll8_poll_sum_f32``, ``ll8_pack``, ``ll8_unpack``,
  and the call-check headers ``ll8_sig_store``, ``ll8_sig_try``, ``ll8_sig_poll``;
* Lamport buffers (``lamport``): ``lamport_store``, ``lamport_try``, ``lamport_poll``, ``lamport_poll_from``,
  ``lamport_reset``, ``lamport_canonical``, ``lamport_missing``, the call-check headers
  ``lamport_header_store``, ``lamport_header_try``, ``lamport_header_poll``, ``lamport_header_reset``,
  ``lamport_poll_checked`` (a peer's data and header in the same looks) and,
  on the host, ``lamport_fill``;
* ordering building blocks (``ordering``): ``ld_acquire``, ``st_release``, ``fence_sys``, and for
  programmatic dependent launch ``pdl_wait``, ``pdl_launch_dependents``, ...
* stage stamps for finding where a kernel's time goes (``trace``): ``stamp``;
* on the host (``launcher``): ``Launcher``, which launches a kernel on a fixed grid with a fraction of
  ``kernel[grid](...)``'s host time.

The library's collectives are written with exactly these functions.

Kernels that take ``rank`` declare ``@triton.jit(do_not_specialize=["rank"])``: Triton compiles an
int argument equal to 1 as a constant, so rank 1 would otherwise run a different compilation than
rank 0, whose in-block reductions (``tl.sum``) may group terms differently: different bits on
different ranks.
"""

from .backend import INTERPRET, MAX_WORLD, interpreting, program_threads
from .barrier import barrier, barrier_arrive, barrier_flag_bytes, barrier_wait
from .consistency import check_signatures, signature_table_bytes
from .copy import copy_block, get, put
from .diag import DIAG_WORDS, KIND_NAMES, KIND_SIGNATURE, already_failed, record_timeout
from .lamport import (
    LAMPORT_SENTINEL8,
    LAMPORT_SENTINEL16,
    lamport_canonical,
    lamport_fill,
    lamport_header_poll,
    lamport_header_reset,
    lamport_header_store,
    lamport_header_try,
    lamport_missing,
    lamport_poll,
    lamport_poll_checked,
    lamport_poll_from,
    lamport_reset,
    lamport_store,
    lamport_try,
)
from .launcher import Launcher
from .ll import (
    ll8_pack,
    ll8_poll,
    ll8_poll_sum_f32,
    ll8_sig_poll,
    ll8_sig_store,
    ll8_sig_try,
    ll8_store,
    ll8_try,
    ll8_unpack,
)
from .memory import (
    address_ptr,
    aligned_runs,
    assume_multiple,
    heap_base,
    heap_ptr,
    next_pow2,
    pow2_at_least,
    pow2_divisor,
    translate,
)
from .numerics import pairwise_sum, round_to
from .ordering import (
    clock_ns,
    fence_sys,
    ld_acquire,
    ld_volatile,
    pdl_launch_dependents,
    pdl_wait,
    st_relaxed,
    st_release,
)
from .signals import (
    epoch_commit,
    epoch_commit_slots,
    epoch_next,
    program_epoch,
    signal,
    signal_add,
    signal_relaxed,
    wait,
    wait_relaxed,
)
from .trace import stamp

if interpreting():  # the CPU world: no repeated patch of the language, no overflow check that asserts nothing,
    # no table of numpy dtypes built per op
    from .interpreter import fixed_np_dtypes, skip_dead_overflow_checks, skip_repatching

    skip_repatching()
    skip_dead_overflow_checks()
    fixed_np_dtypes()

__all__ = [
    "DIAG_WORDS", "INTERPRET", "KIND_NAMES", "KIND_SIGNATURE", "LAMPORT_SENTINEL8", "LAMPORT_SENTINEL16", "MAX_WORLD",
    "Launcher",
    "address_ptr", "aligned_runs", "already_failed", "assume_multiple",
    "barrier", "barrier_arrive", "barrier_flag_bytes", "barrier_wait", "check_signatures", "clock_ns", "copy_block",
    "epoch_commit", "epoch_commit_slots", "epoch_next", "fence_sys", "get", "heap_base", "heap_ptr", "interpreting",
    "lamport_canonical",
    "lamport_fill", "lamport_header_poll", "lamport_header_reset", "lamport_header_store", "lamport_header_try",
    "lamport_missing", "lamport_poll", "lamport_poll_checked", "lamport_poll_from", "lamport_reset", "lamport_store",
    "lamport_try",
    "ld_acquire", "ld_volatile", "ll8_pack", "ll8_poll", "ll8_poll_sum_f32", "ll8_sig_poll", "ll8_sig_store",
    "ll8_sig_try", "ll8_store", "ll8_try", "ll8_unpack",
    "next_pow2", "pairwise_sum", "pdl_launch_dependents", "pdl_wait", "pow2_at_least", "pow2_divisor", "program_epoch",
    "program_threads", "put",
    "record_timeout", "round_to",
    "signal", "signal_add", "signal_relaxed", "signature_table_bytes", "st_relaxed", "st_release", "stamp", "translate",
    "wait", "wait_relaxed",
]
