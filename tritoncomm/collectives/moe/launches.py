"""The MoE collective's algorithms, as objects that own their launchers (as ``allreduce/`` does): the
one-kernel dispatch, the two-kernel dispatch (route and send, or send and gather) and the combine.
Each is built once from the instance's plan and memory (``plan.py``, ``buffers.py``) with every
launch argument that does not change between calls, so a call only passes its tensors and the few
values it decides (``MoEAllToAll``). Nothing here allocates on the launch path."""

from __future__ import annotations

import torch

from ...channels import Communicator
from ...kernels import pow2_at_least
from ...kernels.launcher import Launcher
from .buffers import MoEBuffers
from .combine import launch_combine, moe_combine_kernel
from .dispatch import launch_send, moe_send_kernel
from .gather import launch_gather, moe_gather_kernel
from .onekernel import launch_dispatch_one_kernel, moe_dispatch_one_kernel
from .plan import MoEPlan
from .route import launch_route, moe_route_kernel
from .shape import MoEShape, register_cap

__all__ = ["Combine", "OneKernelDispatch", "TwoKernelDispatch", "launch_options"]


def launch_options(comm: Communicator, shape: MoEShape) -> dict[str, bool | int]:
    """PDL where the shape asks for it and the GPU has it (sm_90+); and a register cap that keeps
    every program of the grid resident at once (``maxnreg``: the SM's registers over the threads of
    ``ceil(programs / SMs)`` programs). Without the cap, the prefill shape's 8-warp gather (FP8) and
    combine took more than 128 registers per thread, so one program per SM ran where two were meant
    to (``docs/moe.md``)."""
    if comm.backend != "cuda":
        return {}
    props = torch.cuda.get_device_properties(comm.device)
    opts: dict[str, bool | int] = {"launch_pdl": True} if shape.pdl and props.major >= 9 else {}
    cap = register_cap(shape, props.multi_processor_count, getattr(props, "regs_per_multiprocessor", 65536))
    if cap is not None:
        opts["maxnreg"] = cap
    return opts


class OneKernelDispatch:
    """``moe_dispatch_one_kernel`` (``onekernel.py``) on the instance's shape and, where the instance
    has one, on its decode shape (``MoEPlan.decode_call``)."""

    def __init__(self, comm: Communicator, plan: MoEPlan, bufs: MoEBuffers) -> None:
        self.comm, self.plan, self.bufs = comm, plan, bufs
        ds = plan.decode_shape
        self.run = Launcher(moe_dispatch_one_kernel, (plan.shape.programs,))
        self.run_decode = Launcher(moe_dispatch_one_kernel, (ds.programs,)) if ds else None
        #: options of each launch (set once here: nothing is decided on the launch path)
        self.opts = launch_options(comm, plan.shape)
        self.decode_opts = launch_options(comm, ds) if ds else {}
        b = bufs
        ids_off, ids_half = b.halves(b.ids)
        wtab_off, wtab_half = b.halves(b.wtab)
        copy_off, copy_half = b.halves(b.copy)
        hdr_off, hdr_half = b.halves(b.hdrs)
        #: the packet buffers, or the plain receive buffer and a barrier
        bufargs = dict(b.packet_args(), peer_rows=plan.packet_rows, packets=True) if plan.packets else \
            dict(b.plain_args(), peer_rows=plan.max_tokens, packets=False)
        self._fixed = dict(max_tokens=plan.max_tokens, num_experts=plan.num_experts, capacity=plan.capacity,
                           local=plan.local_experts, ids_off=ids_off, ids_half=ids_half, wtab_off=wtab_off,
                           wtab_half=wtab_half, copy_off=copy_off, copy_half=copy_half, header=b.header,
                           block_x=plan.block_x, hdr_off=hdr_off, hdr_half=hdr_half, **bufargs)

    def launch(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, *, shape: MoEShape, bound: int,
               sig: int | None, trace: torch.Tensor | None) -> None:
        """One call of at most ``bound`` tokens per rank on ``shape`` (the instance's or its decode shape)."""
        p, b, sh = self.plan, self.bufs, shape
        decode = sh is not p.shape
        entries = bound * p.top_k
        launch_dispatch_one_kernel(
            self.run_decode if decode else self.run, self.comm, b.send_ch, b.out, b.scales, x, ids, weights,
            b.weights, b.slot_of, b.owner, b.row, b.counts, b.bad, b.bad_host.device_addr,
            readers=b.readers if entries >= sh.shared_copy_from else None, bound=bound,
            block_n=min(pow2_at_least(entries), p.block_n) if sh.bounded_copies else p.block_n,
            trace=trace, block_h=sh.one_block_h or sh.send_block_h or sh.block_h, num_warps=sh.num_warps,
            senders=sh.senders(p.world), lookahead=sh.lookahead,
            launch_opts=self.decode_opts if decode else self.opts, sig=sig, **self._fixed)


class TwoKernelDispatch:
    """The dispatch in two kernels: on instances that route, ``moe_route_kernel`` then
    ``moe_send_kernel`` (which lays out the peers' rows too; ``direct``: the rows into the peers'
    slots); on the others ``moe_send_kernel`` then ``moe_gather_kernel`` (``route.py``,
    ``dispatch.py``, ``gather.py``)."""

    def __init__(self, comm: Communicator, plan: MoEPlan, bufs: MoEBuffers, opts: dict[str, bool | int]) -> None:
        self.comm, self.plan, self.bufs = comm, plan, bufs
        programs, sh, b = plan.shape.programs, plan.shape, bufs
        self.run_route = Launcher(moe_route_kernel, (programs,))
        self.run_send = Launcher(moe_send_kernel, (programs,))
        self.run_gather = Launcher(moe_gather_kernel, (programs,))
        ids_off, ids_half = b.halves(b.ids)
        ntab_off, ntab_half = b.halves(b.ntab)
        hist_off, hist_half = b.halves(b.hist)
        self.wtab_off, self.wtab_half = b.halves(b.wtab)
        #: the three kernels' common launch arguments
        self.tables = dict(max_tokens=plan.max_tokens, ids_off=ids_off, ids_half=ids_half, ntab_off=ntab_off,
                           ntab_half=ntab_half, hist_off=hist_off, hist_half=hist_half,
                           hist_blocks=plan.hist_blocks, block_e=sh.block_e, block_x=plan.block_x,
                           super_blocks=sh.super_blocks, num_warps=sh.num_warps, launch_opts=opts)
        #: the send kernel's receive buffers: the packet ones (``routed_packets``) or the plain ones
        self.send_bufs = dict(b.packet_args(), packets=True) if plan.routed_packets else \
            dict(b.plain_args(), packets=False)
        self.plain = b.plain_args()
        self.direct_offs = (b.offset(b.out), b.offset(b.scales)) if plan.direct else None

    def launch(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, *, direct: bool, interleave: bool,
               sig: int | None, trace: torch.Tensor | None) -> None:
        """One call: ``direct`` (``MoEShape.direct_from_bytes``), ``interleave``
        (``MoEShape.interleave_from``); ``trace`` only where the instance routes."""
        p, b, sh = self.plan, self.bufs, self.plan.shape
        routed = b.route_ch is not None  # the same on every rank: the launches pair across ranks
        if routed:
            launch_route(self.run_route, self.comm, b.route_ch, b.send_ch, ids, b.bad,
                         num_experts=p.num_experts, barrier=p.route_barrier or direct, trace=trace, sig=sig,
                         **self.tables)
        launch_send(self.run_send, self.comm, b.send_ch, x, ids, weights, b.weights, b.bad,
                    b.out, b.scales, b.slot_of, b.owner, b.row, b.counts,
                    b.bad_host.device_addr, num_experts=p.num_experts, capacity=p.capacity,
                    local=p.local_experts, wtab_off=self.wtab_off, wtab_half=self.wtab_half,
                    block_h=sh.send_block_h or sh.block_h, routed=routed, block_n=p.held_block_n,
                    header=b.header, trace=trace if routed else None, direct=self.direct_offs if direct else None,
                    lookahead=routed and sh.routed_lookahead, pairs=p.pairs,
                    interleave=interleave, sig=sig, **self.send_bufs, **self.tables)
        if not routed:
            pl = self.plain
            launch_gather(self.run_gather, self.comm, b.send_ch, b.out, b.scales, b.slot_of,
                          b.counts, b.bad, b.bad_host.device_addr, capacity=p.capacity,
                          local=p.local_experts, top_k=p.top_k, recv_off=pl["recv_off"],
                          recv_half=pl["recv_half"], sc_off=pl["sc_off"], sc_half=pl["sc_half"], block_h=sh.block_h,
                          header=b.header, pairs=p.pairs, **self.tables)


class Combine:
    """``moe_combine_kernel`` (``combine.py``) on the instance's shape and, for decode calls, on its
    decode shape."""

    def __init__(self, comm: Communicator, plan: MoEPlan, bufs: MoEBuffers, opts: dict[str, bool | int],
                 decode_opts: dict[str, bool | int]) -> None:
        self.comm, self.plan, self.bufs = comm, plan, bufs
        ds = plan.decode_shape
        self.run = Launcher(moe_combine_kernel, (plan.shape.programs,))
        self.run_decode = Launcher(moe_combine_kernel, (ds.programs,)) if ds else None
        self.opts, self.decode_opts = opts, decode_opts
        b = bufs
        ids_off, ids_half = b.halves(b.ids)
        wtab_off, wtab_half = b.halves(b.wtab)
        self._fixed = dict(max_tokens=plan.max_tokens, throughput_from=plan.throughput_from,
                           lamport_rows=plan.lamport_rows, local=plan.local_experts, ybuf_off=b.offset(b.ybuf),
                           ids_off=ids_off, ids_half=ids_half, wtab_off=wtab_off, wtab_half=wtab_half,
                           part_off=b.offset(b.part), lpart_off=b.offset(b.lpart))

    def launch(self, n_tokens: int, bound: int, trace: torch.Tensor | None) -> torch.Tensor:
        """One call for the dispatch of ``n_tokens`` tokens under ``bound``; returns the full output
        buffer (the caller slices it)."""
        p, b = self.plan, self.bufs
        decode = p.decode_call(bound)
        sh = p.decode_shape if decode else p.shape
        launch_combine(self.run_decode if decode else self.run, self.comm, b.comb_ch, b.header, b.combined,
                       b.weights, b.owner, b.row, b.slot_of, n_tokens, block_h=sh.block_h, num_warps=sh.num_warps,
                       launch_opts=self.decode_opts if decode else self.opts, trace=trace,
                       pushers=sh.pushers(bound, p.hidden), throughput_block_h=sh.throughput_block_h,
                       interleave=p.combine_interleave and not decode and bound >= sh.combine_interleave_from,
                       chunks=0 if decode else p.combine_chunks, **self._fixed)
        return b.combined
