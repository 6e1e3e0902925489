"""The jobs of the vLLM MoE tests, run in the CPU world (``test_vllm_moe``) and on GPUs
(``test_engines_gpu``): vLLM's modular MoE kernel on tritoncomm's prepare/finalize (``kernel_job``),
vLLM's own choice of it with ``TRITONCOMM_MOE=1`` (``switch_job``) and vLLM's default all-gather +
reduce-scatter path served by tritoncomm (``agrs_job``), each against the layer in one process."""

from __future__ import annotations

import torch

from tritoncomm.collectives import MoEAllToAll
from tritoncomm.errors import InvalidInputError
from tritoncomm.integrations import moe_reference
from tritoncomm.integrations.ep import route

from ..conftest import SHARED_GPUS
from ..helpers import make_comm
from . import vllm_extension

EXPERTS_PER_RANK, HIDDEN, INTER, TOP_K, MAX_TOKENS = 4, 256, 128, 3, 8  # FP8 blocks: 128 x 128


def _weights(world: int):
    """The full weights, the same on every rank: router ``[E, H]``, gate/up ``[E, I, H]``, down ``[E, H, I]``."""
    experts = EXPERTS_PER_RANK * world
    g = torch.Generator().manual_seed(11)
    router = torch.randn(experts, HIDDEN, generator=g)
    gate, up = (torch.randn(experts, INTER, HIDDEN, generator=g).div(HIDDEN ** 0.5).to(torch.bfloat16)
                for _ in range(2))
    down = torch.randn(experts, HIDDEN, INTER, generator=g).div(INTER ** 0.5).to(torch.bfloat16)
    return router, gate, up, down


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [E, N, K]`` as e4m3 with one fp32 scale per 128 x 128 block (vLLM's block-quantised weights)."""
    e, n, k = w.shape
    blocks = w.float().view(e, n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    q = (blocks / scale[:, :, None, :, None]).to(torch.float8_e4m3fn).view(e, n, k)
    return q, scale


_RANK_STATE: list = []  # inside a rank: what lives as long as the rank process


def _experts_class(ctx):
    """vLLM's batched experts for this world: its Triton ones on GPUs (those vLLM's CUDA selection
    picks), its reference ones in torch in the CPU world (its Triton ones need its CUDA platform).
    On GPUs vLLM's kernels take their scratch from the worker's workspace manager, which vLLM's
    GPU model runner creates: created here as there, once per rank."""
    from vllm.model_executor.layers.fused_moe.experts import fused_batched_moe as fbm

    if ctx.backend == "cuda":
        from vllm.v1.worker import workspace

        if not workspace.is_workspace_manager_initialized():
            workspace.init_workspace_manager(ctx.device)
    return fbm.BatchedTritonExperts if ctx.backend == "cuda" else fbm.NaiveBatchedExperts


def _capture_probe(ctx) -> None:
    """vLLM's batched experts ask whether the stream captures a graph through
    ``torch.accelerator.current_stream().is_capturing()``: in the CPU world there is no accelerator
    (the answer is "no"); a torch without ``Stream.is_capturing`` (the GPU image's 2.11) gets the
    CUDA form of the same question."""
    from vllm.model_executor.layers.fused_moe.experts import fused_batched_moe as fbm

    if ctx.backend == "cpu":
        fbm._is_capturing_or_compiling = lambda: False
    elif not hasattr(torch.Stream, "is_capturing"):
        fbm._is_capturing_or_compiling = \
            lambda: torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()


def _kernel(ctx, moe: MoEAllToAll, fp8: bool, w1: torch.Tensor, w2: torch.Tensor):
    """vLLM's modular kernel: our prepare/finalize and vLLM's batched experts (``_experts_class``)."""
    vllm_extension.define(_RANK_STATE)
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
        FusedMoEConfig,
        FusedMoEParallelConfig,
        FusedMoEQuantConfig,
        RoutingMethodType,
    )

    from tritoncomm.integrations.vllm_moe import TritonCommPrepareAndFinalize

    parallel = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=ctx.world, ep_size=ctx.world, tp_rank=0,
                                      pcp_rank=0, dp_rank=ctx.rank, ep_rank=ctx.rank, sp_size=1, use_ep=True,
                                      all2all_backend="tritoncomm", enable_eplb=False)
    config = FusedMoEConfig(num_experts=moe.num_experts, experts_per_token=moe.top_k, hidden_dim=HIDDEN,
                            intermediate_size=INTER, num_local_experts=moe.local_experts,
                            num_logical_experts=moe.num_experts, activation=MoEActivation.SILU, device=ctx.device,
                            routing_method=RoutingMethodType.Renormalize, moe_parallel_config=parallel,
                            in_dtype=torch.bfloat16, max_num_tokens=MAX_TOKENS)
    if fp8:
        (w1, s1), (w2, s2) = _fp8_blocks(w1), _fp8_blocks(w2)
        quant = FusedMoEQuantConfig.make(quant_dtype=torch.float8_e4m3fn, block_shape=[128, 128], w1_scale=s1,
                                         w2_scale=s2)
    else:
        quant = FUSED_MOE_UNQUANTIZED_CONFIG
    _capture_probe(ctx)
    experts = _experts_class(ctx)(config, quant, max_num_tokens=MAX_TOKENS, num_dispatchers=ctx.world)
    return mk.FusedMoEKernel(TritonCommPrepareAndFinalize(moe), experts), w1, w2, MoEActivation.SILU


def _on_input_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor,
                        up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Top-1 with the router weight applied to the input (vLLM's ``apply_router_weight_on_input``):
    ``out[t] = expert_{ids[t]}(w[t] * x[t])``, in one process with the full weights."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    xs = (x * weights.to(x.dtype)).float()
    for t in range(x.shape[0]):
        e = int(ids[t, 0])
        h = torch.nn.functional.silu(xs[t] @ gate[e].float().t()) * (xs[t] @ up[e].float().t())
        out[t] = h @ down[e].float().t()
    return out


def kernel_job(ctx, fp8: bool, on_input: bool = False):
    comm = make_comm(ctx, heap_bytes=64 << 20)
    router, gate, up, down = _weights(ctx.world)
    experts = router.shape[0]
    k = 1 if on_input else TOP_K
    moe = MoEAllToAll(comm, max_tokens=MAX_TOKENS, hidden=HIDDEN, num_experts=experts, top_k=k, fp8_dispatch=fp8)
    mine = slice(ctx.rank * EXPERTS_PER_RANK, (ctx.rank + 1) * EXPERTS_PER_RANK)
    w1 = torch.cat([gate[mine], up[mine]], dim=1).to(ctx.device)  # vLLM's [L, 2I, H]: silu(gate x) * up x
    w2 = down[mine].contiguous().to(ctx.device)
    kernel, w1, w2, silu = _kernel(ctx, moe, fp8, w1, w2)
    errs = []
    for rep in range(3):
        gx = torch.Generator().manual_seed(100 * rep + ctx.rank)
        n = 0 if (rep, ctx.rank) == (1, 0) else (rep + ctx.rank) % MAX_TOKENS + 1
        x = torch.randn(n, HIDDEN, generator=gx).to(torch.bfloat16)
        ids, weights = route(x, router, k, not on_input)
        out = kernel.apply(x.to(ctx.device), w1, w2, weights.to(ctx.device),
                           ids.to(ctx.device), silu, global_num_experts=experts, expert_map=None,
                           apply_router_weight_on_input=on_input)
        if n:
            ref = (_on_input_reference(x, ids, weights, gate, up, down) if on_input
                   else moe_reference(x, router, gate, up, down, k).float())
            errs.append(((out.float().cpu() - ref).abs().max() / ref.abs().max()).item())
        else:
            errs.append(0.0 if out.shape == (0, HIDDEN) else float("inf"))
    pf = kernel.prepare_finalize
    delegate = kernel.fused_experts.finalize_weight_and_reduce_impl()
    own = pf.allocate_fused_expert_output((EXPERTS_PER_RANK, moe.capacity, HIDDEN), torch.bfloat16, ctx.device,
                                          delegate)
    other = pf.allocate_fused_expert_output((EXPERTS_PER_RANK, moe.capacity + 1, HIDDEN), torch.bfloat16,
                                            ctx.device, delegate)
    aliased = own is not None and own.data_ptr() == moe.expert_buffer().data_ptr() and other is None
    bad_map = torch.arange(experts, dtype=torch.int32)  # every expert local: not this instance's placement
    try:
        pf.prepare(x, weights, ids, experts, bad_map, False, kernel.fused_experts.quant_config)
        refused = False
    except InvalidInputError:
        refused = True
    moe.close()
    comm.close()
    return errs, refused, aliased


# -- vLLM's own choice (TRITONCOMM_MOE=1) -----------------------------------------------------------
def _deployment(ctx, **parallel):
    """vLLM's groups and parallel config for a data + expert parallel deployment of ``ctx.world``
    ranks (one per replica), after vLLM's loader has run the plugins with ``TRITONCOMM_MOE=1``;
    once per rank process."""
    import os

    import vllm.distributed.parallel_state as ps
    import vllm.plugins
    from vllm.config import ParallelConfig, VllmConfig, get_current_vllm_config, set_current_vllm_config

    from .enginesetup import as_cuda_platform

    if ps.model_parallel_is_initialized():
        return get_current_vllm_config()
    os.environ.update(TRITONCOMM_ENABLE="1", TRITONCOMM_MOE="1")
    vllm.plugins.load_general_plugins()
    if ctx.backend == "cpu":
        as_cuda_platform()
    config = VllmConfig(parallel_config=ParallelConfig(data_parallel_size=ctx.world, enable_expert_parallel=True,
                                                       **parallel))
    config.parallel_config.data_parallel_rank = ctx.rank  # as vLLM's engine core sets it per replica
    scope = set_current_vllm_config(config)
    scope.__enter__()  # for the life of the rank, as in a vLLM worker
    _RANK_STATE.append(scope)
    local = ctx.rank if ctx.backend == "cpu" else ctx.device.index
    nccl = ctx.backend == "cuda" and not SHARED_GPUS  # as vLLM's GPU workers; NCCL refuses shared GPUs
    ps.init_distributed_environment(world_size=ctx.world, rank=ctx.rank, local_rank=local,
                                    backend="nccl" if nccl else "gloo", distributed_init_method=None)
    ps.initialize_model_parallel(tensor_model_parallel_size=1)
    return config


def _moe_config(ctx, config, **kw):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType

    parallel = FusedMoEParallelConfig.make(tp_size_=kw.pop("tp", 1), pcp_size_=1, dp_size_=ctx.world, sp_size_=1,
                                           vllm_parallel_config=config.parallel_config)
    experts = EXPERTS_PER_RANK * ctx.world
    return FusedMoEConfig(num_experts=experts, experts_per_token=TOP_K, hidden_dim=HIDDEN, intermediate_size=INTER,
                          num_local_experts=EXPERTS_PER_RANK, num_logical_experts=experts, device=ctx.device,
                          activation=MoEActivation.SILU, routing_method=RoutingMethodType.Renormalize,
                          moe_parallel_config=parallel, in_dtype=torch.bfloat16, max_num_tokens=MAX_TOKENS, **kw)


def _switch_refusals(moe_config, parallel) -> list[bool]:
    """Whether the builder refuses, before any rank waits, micro-batching, elastic expert
    parallelism, monolithic experts and int8 activations; and fp32 activations (the instance
    refuses them after its communicator is built, which is then closed)."""
    from dataclasses import replace

    from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig

    from tritoncomm.integrations.vllm_moe import build_prepare_finalize

    int8 = FusedMoEQuantConfig.make(quant_dtype=torch.int8, per_act_token_quant=True)
    got = []
    for change, kw in ((("enable_dbo", True), {}), (("enable_elastic_ep", True), {}),
                       (None, dict(use_monolithic=True)), (None, dict(quant_config=int8))):
        saved = getattr(parallel, change[0]) if change else None
        if change:
            setattr(parallel, *change)
        try:
            build_prepare_finalize(moe_config, kw.pop("quant_config", None), **kw)
            got.append(False)
        except InvalidInputError:
            got.append(True)
        finally:
            if change:
                setattr(parallel, change[0], saved)
    try:
        build_prepare_finalize(replace(moe_config, in_dtype=torch.float32), None)
        got.append(False)
    except InvalidInputError:
        got.append(True)
    return got


def switch_job(ctx, fp8: bool):
    vllm_extension.define(_RANK_STATE)
    from vllm.distributed.parallel_state import get_ep_group
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG, FusedMoEQuantConfig
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    from tritoncomm.integrations.vllm_moe import TritonCommPrepareAndFinalize

    config = _deployment(ctx)
    moe_config = _moe_config(ctx, config)
    ours = moe_config.moe_parallel_config.use_batched_activation_format
    # on GPUs vLLM's own selection of the experts, which reads that format (in the CPU world it offers none)
    picked = unquantized.select_unquantized_moe_backend(moe_config)[0].value if ctx.backend == "cuda" else None
    router, gate, up, down = _weights(ctx.world)
    mine = slice(ctx.rank * EXPERTS_PER_RANK, (ctx.rank + 1) * EXPERTS_PER_RANK)
    w1 = torch.cat([gate[mine], up[mine]], dim=1).to(ctx.device)
    w2 = down[mine].contiguous().to(ctx.device)
    _capture_probe(ctx)
    experts_class = _experts_class(ctx)
    kernels = []
    for _ in range(2):  # two layers of one shape share an instance
        if fp8:
            (q1, s1), (q2, s2) = _fp8_blocks(w1), _fp8_blocks(w2)
            quant = FusedMoEQuantConfig.make(quant_dtype=torch.float8_e4m3fn, block_shape=[128, 128], w1_scale=s1,
                                             w2_scale=s2)
            kernel = fp8_oracle.make_fp8_moe_kernel(quant, moe_config, experts_class,
                                                    fp8_oracle.Fp8MoeBackend.BATCHED_TRITON)
            kernels.append((kernel, q1, q2))
        else:
            kernel = unquantized.make_unquantized_moe_kernel(FUSED_MOE_UNQUANTIZED_CONFIG, moe_config,
                                                             unquantized.UnquantizedMoeBackend.BATCHED_TRITON,
                                                             experts_class)
            kernels.append((kernel, w1, w2))
    built = all(isinstance(k.prepare_finalize, TritonCommPrepareAndFinalize) for k, _, _ in kernels)
    instance = kernels[0][0].prepare_finalize.moe
    bounds, dispatch = [], instance.dispatch

    def recorded(*args, **kwargs):
        bounds.append(kwargs.get("tokens_bound"))
        return dispatch(*args, **kwargs)

    instance.dispatch = recorded
    errs = []
    for rep in range(2):
        for kernel, a, b in kernels:
            gx = torch.Generator().manual_seed(100 * rep + ctx.rank)
            n = (rep + ctx.rank) % MAX_TOKENS + 1
            x = torch.randn(n, HIDDEN, generator=gx).to(torch.bfloat16)
            ids, weights = route(x, router, TOP_K, True)
            with set_forward_context(None, config, num_tokens=n):  # vLLM's: every DP rank's count, exchanged
                out = kernel.apply(x.to(ctx.device), a, b, weights.to(ctx.device), ids.to(ctx.device),
                                   moe_config.activation, global_num_experts=router.shape[0], expert_map=None,
                                   apply_router_weight_on_input=False)
            ref = moe_reference(x, router, gate, up, down, TOP_K).float()
            errs.append(((out.float().cpu() - ref).abs().max() / ref.abs().max()).item())
    del instance.dispatch
    # each call bounded by the most tokens of any rank, from vLLM's forward context
    bounded = bounds == [max((rep + r) % MAX_TOKENS + 1 for r in range(ctx.world)) for rep in range(2) for _ in kernels]
    manager = get_ep_group().device_communicator.all2all_manager
    shared = kernels[0][0].prepare_finalize.moe is kernels[1][0].prepare_finalize.moe and \
        len(manager.tritoncomm_moe) == 1
    # what stays vLLM's: tensor parallelism inside the MoE, expert load balancing
    others = (_moe_config(ctx, config, tp=ctx.world).moe_parallel_config.use_batched_activation_format,)
    config.parallel_config.enable_eplb = True
    others += (_moe_config(ctx, config).moe_parallel_config.use_batched_activation_format,)
    config.parallel_config.enable_eplb = False
    refused = _switch_refusals(moe_config, config.parallel_config)
    manager.destroy()  # vLLM's shutdown: closes the instances too
    return ours, built and bounded, shared, errs, others, len(manager.tritoncomm_moe), picked, refused


# -- vLLM's default path: all-gather + reduce-scatter over the data-parallel group ---------------------
def agrs_job(ctx):
    """vLLM's ``AgRsAll2AllManager`` (its default expert-parallel all-to-all) dispatching and
    combining inside vLLM's forward context, as its MoE layers do, with a different token count on
    every rank (some none): the gathered hidden states, top-k weights (fp32) and ids (int32, moved
    as bits) equal every rank's concatenated, the combine equals the rank-order sum of every rank's
    input rows for this rank, over four calls (the last with a shard at the size bound); one row
    more is left to vLLM; ``(served, calls of ours, results)``."""
    from vllm.distributed.parallel_state import get_dp_group, get_ep_group
    from vllm.forward_context import get_forward_context, set_forward_context

    from .enginetest import Spy

    config = _deployment(ctx)
    served = get_dp_group().device_communicator.tritoncomm_dp
    manager = get_ep_group().device_communicator.all2all_manager
    spies = [Spy(served, "all_gatherv"), Spy(served, "reduce_scatterv")]
    dev, ok = ctx.device, []
    try:
        most = served.max_bytes // (ctx.world * HIDDEN * 2)  # the largest shard whose slots fit
        for rep in range(4):
            counts = [(3 * rep + 2 * r) % 5 for r in range(ctx.world)]  # 0-4 tokens a rank
            if rep == 3:  # at the bound: the heap holds both workspaces at their size
                counts[0] = most
            gen = [torch.Generator().manual_seed(100 * rep + r) for r in range(ctx.world)]
            xs = [torch.randn(n, HIDDEN, generator=g).to(torch.bfloat16) for n, g in zip(counts, gen, strict=True)]
            ws = [torch.rand(n, TOP_K, generator=g) for n, g in zip(counts, gen, strict=True)]
            ids = [torch.randint(0, 64, (n, TOP_K), generator=g, dtype=torch.int32)
                   for n, g in zip(counts, gen, strict=True)]
            ys = [torch.randn(sum(counts), HIDDEN, generator=g).to(torch.bfloat16) for g in gen]
            me, start = ctx.rank, sum(counts[:ctx.rank])
            with set_forward_context(None, config, num_tokens=counts[me]), \
                    get_forward_context().dp_metadata.sp_local_sizes(1):
                h, w, i = manager.dispatch(xs[me].to(dev), ws[me].to(dev), ids[me].to(dev))
                out = manager.combine(ys[me].to(dev))
            want = torch.stack([y.float() for y in ys]).sum(0).to(torch.bfloat16)[start:start + counts[me]]
            ok.append((torch.equal(h.cpu(), torch.cat(xs)), torch.equal(w.cpu(), torch.cat(ws)),
                       torch.equal(i.cpu(), torch.cat(ids)), torch.equal(out.cpu(), want)))
        past = torch.zeros(most + 1, HIDDEN, dtype=torch.bfloat16, device=dev)  # one row more: vLLM's own path
        ok.append((served.all_gatherv(past, [most + 1] * ctx.world) is None,
                   served.reduce_scatterv(past.repeat(ctx.world, 1), [most + 1] * ctx.world, None) is None))
    finally:
        calls = [s.calls for s in spies]
        for s in spies:
            s.close()
    return not served.disabled, calls, ok, _carriers()


def _carriers() -> dict:
    """``vllm_agrs.carries`` on vLLM's own ``ParallelConfig`` for the deployments of ``CARRIERS``."""
    from vllm.config import ParallelConfig

    from tritoncomm.integrations.vllm_agrs import carries

    made = {"dp2": {}, "tp2 dp2 (sequence-parallel MoE)": dict(tensor_parallel_size=2),
            "dp2 pcp2": dict(prefill_context_parallel_size=2),
            "tp2": dict(tensor_parallel_size=2, data_parallel_size=1),
            "dp2 deepep": dict(all2all_backend="deepep_low_latency"),
            "dp2, no EP": dict(enable_expert_parallel=False)}
    out = {}
    for name, kw in made.items():
        p = ParallelConfig(**{"data_parallel_size": 2, "enable_expert_parallel": True, **kw})
        out[name] = (carries("dp", p), carries("ep", p))
    return out
