"""The ``tritoncomm`` torch.distributed backend: every torch.distributed program gets tritoncomm.

``dist.init_process_group("cpu:gloo,cuda:tritoncomm")`` (or ``new_group(..., backend=...)``) builds a
``TritonCommProcessGroup``: a ``torch.distributed.ProcessGroup`` whose all-reduce, all-gather,
reduce-scatter and all-to-all run tritoncomm's kernels where they can, and whose every other operation goes to a
gloo (CPU tensors) or NCCL (CUDA tensors) backend it keeps inside, so nothing a program calls fails.

Served (CUDA tensors on GPUs; CPU tensors in the CPU world, ``TRITON_INTERPRET=1``), when the input is
contiguous, of bf16/fp16/fp32, within the set-up size, and the reduction is a sum:

* ``allreduce`` (``dist.all_reduce``, functional ``all_reduce``, under ``torch.compile``) and
  ``allreduce_coalesced`` (each tensor in turn);
* ``all_gather_single`` / ``_allgather_base`` (``dist.all_gather_into_tensor``, by torch version),
  ``allgather_into_tensor_coalesced`` (the functional all-gather) and the list form ``allgather`` (one
  input, outputs shaped like it);
* ``reduce_scatter_single`` / ``_reduce_scatter_base`` (``dist.reduce_scatter_tensor``),
  ``reduce_scatter_tensor_coalesced`` (functional) and the list form ``reduce_scatter``;
* ``alltoall_base`` (``dist.all_to_all_single``) with equal splits (none given, or all equal).

Anything else, and any call that does not qualify, goes to the inner backend with the same arguments;
each kind of delegation is logged once per group. Whether a call is served depends only on what every
rank of a collective agrees on (op, dtype, element count, the group, the sizes), never on a tensor's
layout or address, so the ranks never split: a served tensor that is not contiguous, or an input that
overlaps its output, goes through a local contiguous copy (``_into``).

Ordering: a served collective runs on the caller's current CUDA stream, at the call. Its work
object's ``wait()`` makes the then-current stream wait for it, like NCCL's (see ``TritonCommWork``);
its future holds the outputs. A synchronous call (``async_op=False``) gets the group's one completed
work object back, whose ``result()`` is the latest synchronous call's outputs. Served calls
can be captured in CUDA graphs; inside ``graph_capture(group)`` their outputs are also registered.

Set-up is collective: building the group (as torch.distributed does for every group) probes the
ranks, maps a symmetric heap and sets up the collectives. CUDA groups are bound to the current device
when they are built (``torch.cuda.set_device`` first, as with NCCL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, AllreduceCoalescedOptions
from torch.distributed import ProcessGroup, ReduceOp

from .. import settings
from ..channels import Communicator
from ..channels.bootstrap import StoreBootstrap
from ..collectives import AllGather, AllReduce, AllToAll, ReduceScatter
from ..collectives.validation import SUPPORTED_DTYPES, overlap
from ..config import BACKEND, CommConfig
from ..errors import CollectiveMismatchError, CommTimeoutError
from ..kernels.backend import interpreting
from .capability import probe
from .work import TritonCommWork, current_stream_key

__all__ = ["BACKEND", "TritonCommProcessGroup", "TritonCommWork", "create_process_group", "graph_capture"]

log = logging.getLogger("tritoncomm")

#: Served sizes (input bytes of an all-reduce, output bytes of an all-gather, input bytes of a
#: reduce-scatter, of an all-to-all); ``TRITONCOMM_BACKEND_MAX_BYTES`` overrides all four.
MAX_BYTES = {"cuda": (64 << 20, 16 << 20, 16 << 20, 16 << 20), "cpu": (1 << 20, 1 << 20, 1 << 20, 1 << 20)}


@contextmanager
def graph_capture(group: ProcessGroup | None = None) -> Iterator[None]:
    """Wrap CUDA-graph capture with it (as engines wrap theirs): the outputs of the tritoncomm group's
    served collectives captured inside are mapped into every peer on exit, so replays write them
    directly. Other groups, and the CPU world: nothing. Collective over ``group`` (default: the world)."""
    group = group if group is not None else dist.group.WORLD
    comm = getattr(group, "comm", None)
    if isinstance(group, TritonCommProcessGroup) and comm is not None and comm.backend == "cuda":
        with comm.graph_capture():
            yield
    else:
        yield


def create_process_group(opts: Any, backend_options: Any) -> TritonCommProcessGroup:
    """The backend's constructor, as torch.distributed calls it (``registration.register``)."""
    return TritonCommProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                                  global_ranks=list(opts.global_ranks_in_group), group_id=opts.group_id)


def _is_sum(opts: Any) -> bool:
    return opts is None or opts.reduceOp == ReduceOp.SUM


def _equal_splits(splits: Sequence[int], t: torch.Tensor, world: int) -> bool:
    """Whether ``all_to_all_single``'s split sizes (rows of dim 0; none given: equal) split ``t`` into
    ``world`` equal shards."""
    if not splits:
        return t.dim() == 0 or t.shape[0] % world == 0
    return len(splits) == world and all(s == splits[0] for s in splits) and splits[0] * world == t.shape[0]


class TritonCommProcessGroup(ProcessGroup):
    """See the module docstring. Built by torch.distributed through the registered creator."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, *,
                 global_ranks: Sequence[int] = (), group_id: str = "") -> None:
        super().__init__(rank, size)
        self._group_id = group_id
        self._delegate = ProcessGroup(rank, size)  # the inner backends, behind torch's own dispatch
        self._logged: set[str] = set()
        #: The latest delegated call's work, held until the next one replaces it (see ``_delegated``).
        self._last_delegated: Any = None
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("tritoncomm/gloo/", store), rank, size, timeout)
        gloo.options.global_ranks_in_group = list(global_ranks)
        gloo.options.group_name = group_id
        backends = [(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)]
        if dist.is_nccl_available() and torch.cuda.is_available():
            nccl_opts = dist.ProcessGroupNCCL.Options()
            nccl_opts._timeout = timeout
            nccl_opts.global_ranks_in_group = list(global_ranks)
            nccl_opts.group_name = group_id
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("tritoncomm/nccl/", store), rank, size, nccl_opts)
            backends.append((torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl))
        for pg in (self, self._delegate):
            for device, kind, backend in backends:
                pg._register_backend(device, kind, backend)
            pg._set_default_backend(backends[-1][1])
        self._backends = backends
        #: Every synchronous served call returns this: creating a work object costs microseconds of
        #: host time, and a synchronous call's work has nothing left to wait for.
        self._done = TritonCommWork([], failure=self._failure)
        self._serve_type = "cpu" if interpreting() else ("cuda" if torch.cuda.is_available() else "")
        self.comm: Communicator | None = None
        self.device: torch.device | None = None  # the served device; None while nothing is served
        self.ar: AllReduce | None = None
        self.ag: AllGather | None = None
        self.rs: ReduceScatter | None = None
        self.a2a: AllToAll | None = None
        if not self._serve_type:
            return
        device = torch.device("cuda", torch.cuda.current_device()) if self._serve_type == "cuda" else \
            torch.device("cpu")
        most = settings.BACKEND_MAX_BYTES.get()
        ar_max, ag_max, rs_max, a2a_max = (most,) * 4 if most is not None else MAX_BYTES[self._serve_type]
        heap = CommConfig().resolved_heap_bytes(self._serve_type)
        # the kernels' waits: bounded by the group's timeout (as NCCL's collectives are), and by the default
        wait_s = min(CommConfig().timeout_s, timeout.total_seconds()) if timeout.total_seconds() > 0 else None
        config = CommConfig(heap_bytes=max(heap, 3 * (ar_max + ag_max + rs_max + a2a_max) + (16 << 20)),
                            **({"timeout_s": wait_s} if wait_s else {}))
        boot = StoreBootstrap(dist.PrefixStore("tritoncomm/boot/", store), rank, size)
        verdict = probe(None, device, config, bootstrap=boot)
        if not verdict.ok:
            log.warning("tritoncomm backend: group %s delegates everything (%s)", group_id, verdict.reason)
            return
        self.comm = Communicator(bootstrap=boot, device=device, config=config)
        self.ar = AllReduce(self.comm, max_bytes=ar_max, name="backend.ar")
        self.ag = AllGather(self.comm, max_bytes=ag_max, name="backend.ag")
        self.rs = ReduceScatter(self.comm, max_bytes=rs_max, name="backend.rs")
        self.a2a = AllToAll(self.comm, max_bytes=a2a_max, name="backend.a2a")
        self.device = device

    def getBackendName(self) -> str:
        return BACKEND

    def _failure(self) -> BaseException | None:
        """What a served call's work reports as its failure: the communicator's recorded timeout or
        mismatch (host-visible memory, no synchronisation; the communicator is unusable from then on),
        or None."""
        comm = self.comm
        if comm is None or comm.closed:
            return None
        try:
            comm.check()
        except (CommTimeoutError, CollectiveMismatchError) as e:
            return e
        return None

    # -- what is served ------------------------------------------------------------------------------
    def _ok(self, t: torch.Tensor) -> bool:
        return t.device == self.device and t.dtype in SUPPORTED_DTYPES

    @staticmethod
    def _into(collective: Callable[[torch.Tensor, torch.Tensor], Any], inp: torch.Tensor, out: torch.Tensor) -> None:
        """``collective(inp, out)`` whatever their layouts: an input that is not contiguous, or that
        overlaps a distinct output, is copied first; an output that is not contiguous is produced in a
        contiguous tensor and copied back. Contiguous, separate (or identical, in place) tensors go
        straight through."""
        i = inp
        if not inp.is_contiguous():
            i = inp.contiguous()
        elif out is not inp and overlap(out, inp):
            i = inp.clone()
        o = out if out.is_contiguous() else (i if out is inp else torch.empty(out.shape, dtype=out.dtype,
                                                                              device=out.device))
        collective(i, o)
        if o is not out:
            out.copy_(o)

    def _delegated(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of the inner backend. Every delegated call goes through here, from Python, so the
        caller's thread waits for the inner backend with the GIL released: gloo's worker thread may
        need the GIL while it holds the process group's lock (to free a finished work whose tensors
        Python no longer references), and a caller holding the GIL while it waits for that lock
        deadlocks (seen in the CPU world when an operation with no Python method here went straight to
        torch's C++ dispatch). The latest work is also held here, so that its last reference is
        usually the caller's."""
        if what not in self._logged:
            self._logged.add(what)
            log.info("tritoncomm backend: group %s hands %s to its inner gloo/NCCL backend", self._group_id, what)
        work = getattr(self._delegate, method)(*args, **kwargs)
        self._last_delegated = work
        return work

    def _work(self, outputs: list[torch.Tensor], opts: Any) -> TritonCommWork:
        if opts is not None and getattr(opts, "asyncOp", False):
            return TritonCommWork(outputs, current_stream_key() if self._serve_type == "cuda" else None,
                                  self._failure)
        done = self._done
        done._outputs = outputs
        return done

    def _ar_ok(self, t: torch.Tensor) -> bool:
        return t.device == self.device and t.nbytes <= self.ar.max_bytes and t.dtype in SUPPORTED_DTYPES

    def _ag_ok(self, out: torch.Tensor, inp: torch.Tensor) -> bool:
        return (self._ok(inp) and self._ok(out) and out.dtype == inp.dtype
                and out.numel() == inp.numel() * self.size() and out.nbytes <= self.ag.max_bytes)

    def _rs_ok(self, out: torch.Tensor, inp: torch.Tensor) -> bool:
        return (self._ok(inp) and self._ok(out) and out.dtype == inp.dtype
                and inp.numel() == out.numel() * self.size() and inp.nbytes <= self.rs.max_bytes)

    def _rows_ok(self, t: torch.Tensor, parts: list[torch.Tensor], rows: list[int],
                 collective: AllGather | ReduceScatter) -> bool:
        """Shards of ``rows`` rows shaped like ``t`` past dim 0 (``parts``: one per rank, the same
        shapes on every rank) that ``collective`` serves (``fits_rows``)."""
        if not (self._ok(t) and t.dim() > 0 and len(parts) == self.size() and all(
                p.dim() == t.dim() and p.shape[1:] == t.shape[1:] and p.dtype == t.dtype for p in parts)):
            return False
        return collective.fits_rows(rows, int(torch.Size(t.shape[1:]).numel()), t.element_size())

    def _a2a_ok(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                in_splits: Sequence[int]) -> bool:
        w = self.size()
        return (self._ok(inp) and self._ok(out) and out.dtype == inp.dtype and out.numel() == inp.numel()
                and inp.numel() % w == 0 and inp.nbytes <= self.a2a.max_bytes
                and _equal_splits(out_splits, out, w) and _equal_splits(in_splits, inp, w))

    # -- all-reduce -----------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if len(tensors) == 1 and self._ar_ok(tensors[0]) and _is_sum(opts):  # the hot path: checks cheapest first
            self._into(self.ar, tensors[0], tensors[0])
            return self._work(tensors, opts)
        return self._delegated("this all_reduce", "allreduce", tensors, *self._opts(opts, dist.AllreduceOptions))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if _is_sum(opts) and all(self._ar_ok(t) for t in tensors):
            for t in tensors:
                self._into(self.ar, t, t)
            return self._work(tensors, opts)
        return self._delegated("this all_reduce_coalesced", "allreduce_coalesced", tensors,
                               *self._opts(opts, AllreduceCoalescedOptions))

    # -- all-gather -----------------------------------------------------------------------------------
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if self._ag_ok(output, input):
            self._into(self.ag, input, output)
            return self._work([output], opts)
        return self._delegated("this all_gather", "all_gather_single", output, input,
                               *self._opts(opts, AllgatherOptions))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if self._ag_ok(output, input):
            self._into(self.ag, input, output)
            return self._work([output], opts)
        return self._delegated("this all_gather", "_allgather_base", output, input,
                               *self._opts(opts, AllgatherOptions))

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        if all(self._ag_ok(o, i) for o, i in zip(outputs, inputs, strict=True)):
            for o, i in zip(outputs, inputs, strict=True):
                self._into(self.ag, i, o)
            return self._work(list(outputs), opts)
        return self._delegated("this functional all_gather", "allgather_into_tensor_coalesced", outputs, inputs,
                               *self._opts(opts, AllgatherOptions))

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        if len(inputs) == 1 and len(output_lists) == 1 and self._ok(inputs[0]) and all(
                o.shape == inputs[0].shape and o.dtype == inputs[0].dtype for o in output_lists[0]):
            flat = inputs[0].new_empty((self.size() * inputs[0].numel(),))
            if self._ag_ok(flat, inputs[0]):
                self._into(self.ag, inputs[0], flat)
                for r, o in enumerate(output_lists[0]):
                    o.copy_(flat[r * inputs[0].numel():(r + 1) * inputs[0].numel()].view_as(o))
                return self._work(output_lists[0], opts)
        if len(inputs) == 1 and len(output_lists) == 1:  # shards of different rows (all_gatherv)
            inp, outs = inputs[0], output_lists[0]
            rows = [o.shape[0] if o.dim() else 0 for o in outs]
            if self._rows_ok(inp, outs, rows, self.ag) and rows[self.rank()] == inp.shape[0]:
                flat = self.ag(inp.contiguous(), sizes=rows)
                for o, part in zip(outs, flat.split(rows), strict=True):
                    o.copy_(part)
                return self._work(outs, opts)
        return self._delegated("this list all_gather", "allgather", output_lists, inputs,
                               *self._opts(opts, AllgatherOptions))

    # -- reduce-scatter ---------------------------------------------------------------------------------
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if _is_sum(opts) and self._rs_ok(output, input):
            self._into(self.rs, input, output)
            return self._work([output], opts)
        return self._delegated("this reduce_scatter", "reduce_scatter_single", output, input,
                               *self._opts(opts, dist.ReduceScatterOptions))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if _is_sum(opts) and self._rs_ok(output, input):
            self._into(self.rs, input, output)
            return self._work([output], opts)
        return self._delegated("this reduce_scatter", "_reduce_scatter_base", output, input,
                               *self._opts(opts, dist.ReduceScatterOptions))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        if _is_sum(opts) and all(self._rs_ok(o, i) for o, i in zip(outputs, inputs, strict=True)):
            for o, i in zip(outputs, inputs, strict=True):
                self._into(self.rs, i, o)
            return self._work(list(outputs), opts)
        return self._delegated("this functional reduce_scatter", "reduce_scatter_tensor_coalesced", outputs, inputs,
                               *self._opts(opts, dist.ReduceScatterOptions))

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        if (len(outputs) == 1 and len(input_lists) == 1 and _is_sum(opts) and self._ok(outputs[0])
                and all(i.shape == outputs[0].shape and i.dtype == outputs[0].dtype for i in input_lists[0])):
            flat = torch.cat([i.reshape(-1) for i in input_lists[0]])
            if self._rs_ok(outputs[0], flat):
                self._into(self.rs, flat, outputs[0])
                return self._work(outputs, opts)
        elif len(outputs) == 1 and len(input_lists) == 1 and _is_sum(opts):  # shards of different rows
            out, parts = outputs[0], input_lists[0]
            rows = [p.shape[0] if p.dim() else 0 for p in parts]
            if self._rows_ok(out, parts, rows, self.rs) and rows[self.rank()] == out.shape[0] \
                    and all(p.device == out.device for p in parts):
                self._into(lambda i, o: self.rs(i, o, sizes=rows), torch.cat(parts), out)
                return self._work(outputs, opts)
        return self._delegated("this list reduce_scatter", "reduce_scatter", outputs, input_lists,
                               *self._opts(opts, dist.ReduceScatterOptions))

    # -- all-to-all -----------------------------------------------------------------------------------
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                      input_split_sizes: Sequence[int], opts: Any = None) -> dist.Work:
        if self._a2a_ok(output, input, output_split_sizes, input_split_sizes):
            self._into(self.a2a, input, output)
            return self._work([output], opts)
        return self._delegated("this all_to_all", "alltoall_base", output, input, output_split_sizes,
                               input_split_sizes, *self._opts(opts, dist.AllToAllOptions))

    # -- life ----------------------------------------------------------------------------------------
    @staticmethod
    def _opts(opts: Any, kind: Callable[[], Any]) -> tuple[Any, ...]:
        return (opts if opts is not None else kind(),)

    def _close(self) -> None:
        self.device = None  # nothing is served from here on
        self._last_delegated = None
        if self.comm is not None:
            for c in (self.ar, self.ag, self.rs, self.a2a):
                c.close()
            self.comm.close()
            self.comm = None

    def shutdown(self) -> None:
        self._close()
        self._delegate.shutdown()

    def abort(self) -> None:
        self._close()
        self._delegate.abort()


#: Operations never served: forwarded to the inner backend through ``_delegated``.
FORWARDED = ("broadcast", "alltoall", "send", "recv", "recv_anysource", "barrier", "reduce",
             "gather", "scatter")


def _forwarder(name: str) -> Callable[..., Any]:
    def forward(self: TritonCommProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return self._delegated(f"{name}", name, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``{name}``: the inner backend's (see ``_delegated``)."
    return forward


for _name in FORWARDED:
    setattr(TritonCommProcessGroup, _name, _forwarder(_name))
