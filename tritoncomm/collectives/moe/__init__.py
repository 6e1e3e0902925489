"""Mixture-of-experts dispatch and combine over the symmetric heap (expert parallelism).

``MoEAllToAll`` (collective to create, once per communicator): ``num_experts`` experts split evenly
over the ranks (expert ``e`` on rank ``e // local_experts``), up to ``max_tokens`` tokens per rank and
call, ``top_k`` experts per token, at most ``capacity`` entries per expert and call.

* ``dispatch(x, topk_ids, topk_weights, tokens_bound=None)``: one kernel for decode-sized instances
  (``MoEShape.one_kernel``: ``onekernel.py``; with ``MoEShape.packets`` its routing, rows and
  weights travel as Lamport packets and it has no barrier) and for calls whose ``tokens_bound``
  (the same on every rank) is small enough, two for the others, all with the same results: a
  token's -0.0 arrives as +0.0 on every path (FP8 too), a weight at the fp32 Lamport sentinel as
  -0.0 (``kernels/lamport.py``). On
  prefill-sized instances ``moe_route_kernel`` sends this rank's routing to every rank, then
  ``moe_send_kernel`` sends each token once to each rank that holds one of its experts, lays out
  this rank's own tokens on its own experts meanwhile, and after its barrier slot lays out the
  peers' tokens (in large calls, ``MoEShape.direct_from_bytes``, each token goes straight into its
  first slot on the peer, which copies it into its other slots); on the smaller ones the send
  kernel carries the routing and ``moe_gather_kernel`` lays out the peers' tokens. The slots are
  the same on every rank, computed without talking (``route.py``: the entries ``(source rank,
  token, j)`` of expert ``e`` get slots ``0, 1, ...`` in the order of their sources relative to
  ``e``'s owner, its own first, then of ``(token, j)``; entries past ``capacity`` are dropped);
  each row is read once and stored once per kept entry into ``[local_experts, capacity, hidden]``.
  Returns that tensor (rows past ``counts[e]`` are undefined), ``counts`` (int32, on the device)
  and a handle for ``combine``. An expert id of -1 means "no expert". With ``fp8_dispatch`` tokens
  travel as e4m3 with one fp32 scale per 128 values (``scale = max(amax, 1e-12) / 448``, computed
  on the device, ``wire.py``) and the first result is ``(values [local_experts, capacity, hidden]
  e4m3, scales [local_experts, capacity, hidden / 128] fp32)``.
* ``combine(y, handle)``: ``y [local_experts, capacity, hidden]`` (write it into ``expert_buffer()`` to
  skip a copy); returns ``out[t] = sum_j topk_weights[t, j] * y_owner[expert, slot]``: per owner rank
  the fp32 sum in ``j`` order rounded to the dtype, those partials summed in fp32 in rank order
  (``combine.py`` states it exactly), so the bits never depend on arrival order nor on the mode.
  Each owner sums its experts' outputs per token and pushes one row per token home, in one of two
  modes chosen on the device per call from the total token count over the ranks: latency (below
  ``throughput_from``: Lamport packets, no barrier) and throughput (bulk stores, then a barrier);
  by default ``throughput_from = default_throughput_from(world, hidden, switches)`` (the device table's).
  ``mode="latency"`` or ``"throughput"`` fixes the mode; ``"latency"`` (and ``"auto"`` at world 1,
  where it always chooses latency) spares the partials buffer (``world * max_tokens * hidden``
  elements of the heap), ``"throughput"`` the Lamport buffer (``world * min(max_tokens,
  throughput_from - 1) * hidden``).

With ``MoEShape.pdl`` (on GPUs from sm_90 on) every kernel is launched with programmatic dependent
launch: it starts while the previous one ends and waits for it (``pdl_wait``) before touching memory.

The launch shape follows the instance's size (``default_shape``: ``max_tokens`` against
``prefill_from``) unless ``shape`` is given; ``tune --op moe`` measures both switches
(``tools/moetune.py``). On an instance sized from ``prefill_from`` on, calls whose ``tokens_bound``
is below ``decode_below`` (by default ``prefill_from``) launch their one-kernel dispatch and their
combine with ``decode_shape`` (by default the shape a decode-sized instance gets: fewer, narrower
programs), on the same buffers and channels.

No host synchronisation: routing stays on the device, so both calls can be captured in CUDA graphs
and replayed with new routing. Other ids outside ``[0, num_experts)`` are dropped on the device and
reported by an error at the first ``dispatch`` after the call that dropped them has finished on the
device (the count reaches the host through host-mapped memory, without a sync); every write stays in
bounds. The tensors ``dispatch`` and ``combine`` return are reused by the next call; a handle serves
one ``combine``, and ``dispatch`` and ``combine`` alternate.

The launch shape (``MoEShape``), the shapes an instance given none takes and the measured defaults
behind them: ``shape.py``. The host side: ``alltoall.py`` (the collective), ``plan.py`` (what an
instance decides at set-up), ``buffers.py`` (its memory), ``launches.py`` (its algorithms and
their launchers); one kernel and its launcher per module otherwise.
"""

from .alltoall import DISPATCH_PATHS, MoEAllToAll, MoEHandle
from .buffers import heap_bytes_bound
from .plan import MODES
from .shape import (
    DIRECT_FROM_BYTES,
    MOE_SWITCHES,
    NARROW_SEND_UP_TO,
    NEVER,
    ONE_KERNEL_ENTRIES,
    PREFILL_FROM,
    PREFILL_ONE_KERNEL_ENTRIES,
    PREFILL_ONE_KERNEL_ENTRIES_WIDE,
    PUSH_SPLIT_ELEMS,
    SHAPES,
    SHARED_COPY_FROM,
    THROUGHPUT_FROM_ELEMS,
    THROUGHPUT_FROM_ELEMS_EP2,
    MoEShape,
    default_prefill_from,
    default_shape,
    default_throughput_from,
    register_cap,
)

__all__ = ["DIRECT_FROM_BYTES", "DISPATCH_PATHS", "MODES", "MOE_SWITCHES", "NARROW_SEND_UP_TO", "NEVER",
           "ONE_KERNEL_ENTRIES", "PREFILL_FROM", "PREFILL_ONE_KERNEL_ENTRIES", "PREFILL_ONE_KERNEL_ENTRIES_WIDE",
           "PUSH_SPLIT_ELEMS", "SHAPES", "SHARED_COPY_FROM", "THROUGHPUT_FROM_ELEMS", "THROUGHPUT_FROM_ELEMS_EP2",
           "MoEAllToAll", "MoEHandle", "MoEShape", "default_prefill_from", "default_shape", "default_throughput_from",
           "heap_bytes_bound", "register_cap"]
