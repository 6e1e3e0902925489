"""In-rank checks that the CPU world's engine tests and the GPU's both run: vLLM's sequence-parallel
collectives and fusion pass, SGLang's fused add-RMSNorm. Inputs are made on the host from seeded
generators and moved to the rank's device; results come back to the host to be compared with the
engine's unfused path."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .enginetest import Spy, gathered, host, rank_order_sum, rel_err

HIDDEN, EPS = 64, 1e-6


def _same_on_every_rank(ctx, t: torch.Tensor) -> bool:
    t = host(t)
    raw = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    return torch.equal(raw, gathered(ctx, raw)[0])


# -- vLLM: sequence parallelism (sp_all_gather / sp_reduce_scatter) -------------------------------------
def vllm_sequence_parallel(ctx, dtype) -> tuple:
    """vLLM's sequence-parallel all-gather and reduce-scatter of random rows, and a reduce-scatter of
    rows that vLLM pads to a multiple of the world: ``(all-gather exact, reduce-scatter exact, padded
    output's shape, [ca_comm's all-gather calls, its reduce-scatter calls])``."""
    from vllm.distributed import get_tp_group
    from vllm.models.common.ops.sequence_parallel import sp_all_gather, sp_reduce_scatter

    ca = get_tp_group().device_communicator.ca_comm
    spies = Spy(ca, "custom_all_gather"), Spy(ca, "custom_reduce_scatter")
    try:
        g = torch.Generator().manual_seed(7 + ctx.rank)
        shard = torch.randn(5, 24, generator=g).to(dtype)
        full = host(sp_all_gather(shard.to(ctx.device)))
        x = torch.randn(6, 24, generator=g).to(dtype)
        part = host(sp_reduce_scatter(x.to(ctx.device)))
        want = rank_order_sum(gathered(ctx, x), dtype).chunk(ctx.world)[ctx.rank]
        padded = sp_reduce_scatter(torch.randn(5, 24, generator=g).to(dtype).to(ctx.device))  # 5 rows padded to 6
        return (torch.equal(full, torch.cat(gathered(ctx, shard))), torch.equal(part, want), tuple(padded.shape),
                [s.calls for s in spies])
    finally:
        for s in spies:
            s.close()


def check_vllm_sequence_parallel(result: tuple) -> None:
    ag_ok, rs_ok, padded, calls = result
    assert ag_ok and rs_ok
    assert padded == (3, 24)
    assert calls == [1, 2]


# -- vLLM: the fusion pass on graphs of vLLM's own ops ---------------------------------------------------
def vllm_layers(quant: bool) -> Callable:
    """Three layers' all-reduce + RMSNorm as vLLM's models write them: the first layer's (its sum is
    the residual), an all-reduce + add + RMSNorm (+ the static FP8 quant), and the last layer's, whose
    new residual is dropped. Inside a rank whose vLLM groups are up."""
    import vllm.ir.ops as ir_ops
    from vllm.distributed import tensor_model_parallel_all_reduce as all_reduce
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    q = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR, compile_native=False)

    def layers(x1, x2, x3, w, scale):
        y = all_reduce(x1)
        h1 = ir_ops.rms_norm(y, w, EPS)
        h2, res = ir_ops.fused_add_rms_norm(all_reduce(x2), y, w, EPS)
        if quant:
            h2 = q(h2, scale)[0]
        h3, _ = ir_ops.fused_add_rms_norm(all_reduce(x3), res, w, EPS)
        return h1, h2, res, h3

    return layers


def vllm_fusion(ctx, quant: bool, compiled: bool) -> dict:
    """``TritonCommFusionPass`` on the graph of ``vllm_layers``: traced by ``make_fx`` and passed
    through it, or (``compiled``) compiled by ``torch.compile``'s default inductor backend with the
    pass as inductor's post-grad custom pass, as vLLM's pass manager is (inductor's graph cache off,
    so that the pass sees the graph). Runs the rewritten graph twice on fresh data against vLLM's
    eager unfused path: ``{"matches", "fused" (ops in the fx graph; None compiled), "all_reduces"
    (before, after; None compiled), "served" (calls of the TP group's fused all-reduce + RMSNorm),
    "runs"}``, a run being ``(dtypes, residual exact, relative errors, same on every rank)``."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from vllm.config import get_current_vllm_config
    from vllm.distributed import get_tp_group

    from tritoncomm.integrations.vllm_fusion import TritonCommFusionPass

    fusion = TritonCommFusionPass(get_current_vllm_config(), hidden=HIDDEN, max_tokens=8, dtype=torch.bfloat16)
    layers = vllm_layers(quant)
    g = torch.Generator().manual_seed(3)  # the weights and scale are the same on every rank
    w = torch.randn(HIDDEN, generator=g).to(torch.bfloat16).to(ctx.device)
    scale = torch.tensor([0.05], device=ctx.device)
    out: dict = {"fused": None, "all_reduces": None}
    if compiled:
        run = torch.compile(layers, fullgraph=True,
                            options={"post_grad_custom_post_pass": fusion, "fx_graph_cache": False})
    else:
        example = [torch.randn(6, HIDDEN, dtype=torch.bfloat16, device=ctx.device) for _ in range(3)]
        gm = make_fx(layers, tracing_mode="fake")(*example, w, scale)

        def count(target) -> int:
            return sum(n.target is target for n in gm.graph.nodes)

        before = count(torch.ops.vllm.all_reduce.default)
        fusion(gm.graph)
        gm.graph.lint()
        gm.recompile()
        out["all_reduces"] = before, count(torch.ops.vllm.all_reduce.default)
        out["fused"] = count(torch.ops.tritoncomm.vllm_fused_add_rms_norm.default)
        run = gm
    runs = []
    spy = Spy(get_tp_group().device_communicator.ca_comm, "fused_add_rms_norm")  # vLLM's eager path never calls it
    try:
        for rep in range(2):  # the same graph, fresh data
            gr = torch.Generator().manual_seed(100 * rep + ctx.rank)
            xs = [torch.randn(6, HIDDEN, generator=gr).to(torch.bfloat16).to(ctx.device) for _ in range(3)]
            got = [host(t) for t in run(*xs, w, scale)]
            want = [host(t) for t in layers(*xs, w, scale)]
            runs.append((tuple(a.dtype for a in got), torch.equal(got[2], want[2]),
                         [rel_err(a, b) for a, b in zip(got, want, strict=True)],
                         all(_same_on_every_rank(ctx, t) for t in got)))
    finally:
        spy.close()
    out["matches"], out["served"], out["runs"] = fusion.matched_count, spy.calls, runs
    return out


def check_vllm_fusion(out: dict, quant: bool, compiled: bool) -> None:
    """What ``vllm_fusion`` must give on every rank."""
    assert out["matches"] == 3, out["matches"]
    assert out["served"] == 6, "the rewritten graph did not call tritoncomm's fused op three times a run"
    if not compiled:
        assert out["fused"] == 3 and out["all_reduces"] == (3, 0), out
    for dtypes, residual_exact, errs, same in out["runs"]:
        assert dtypes[1] == (torch.float8_e4m3fn if quant else torch.bfloat16)
        assert residual_exact, "the residual differs from vLLM's unfused path"
        # vLLM rounds the norm twice (to the dtype, then after the weight), tritoncomm once: within two
        # 16-bit ulps, and within one FP8 step where that rounding moves the quantised value
        h1, h2, _, h3 = errs
        assert max(h1, h3) <= 2 ** -6 and h2 <= (2 ** -3 if quant else 2 ** -6), errs
        assert same, "ranks differ"


# -- SGLang: its fused add-RMSNorm entry ----------------------------------------------------------------
def sglang_inputs(ctx, tokens: int, hidden: int, dtype, rep: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)  # residual and weight equal on every rank, as in a TP model
    residual = torch.randn(tokens, hidden, generator=g).to(dtype)
    weight = torch.randn(hidden, generator=g).to(dtype)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(100 * rep + ctx.rank)).to(dtype)
    return x, residual, weight


def sglang_unfused(ctx, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, dtype):
    """SGLang's unfused path on host tensors: all-reduce (the rank-order sum), add, RMSNorm."""
    s = rank_order_sum(gathered(ctx, x), dtype)
    res = (s.float() + residual.float()).to(dtype)
    v = res.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(dtype), res


def sglang_fused(ctx, tokens: int, hidden: int, dtype) -> list:
    """SGLang's ``flashinfer_allreduce_residual_rmsnorm`` twice on fresh data: per call None (SGLang's
    "not handled") or ``(residual exact, residual input untouched, norm's relative error, same on
    every rank)``."""
    import sglang.srt.layers.flashinfer_comm_fusion as fc

    out = []
    for rep in range(2):
        x, residual, weight = sglang_inputs(ctx, tokens, hidden, dtype, rep)
        xd, rd, wd = (t.to(ctx.device) for t in (x, residual, weight))
        norm, res = fc.flashinfer_allreduce_residual_rmsnorm(input_tensor=xd, residual=rd, weight=wd,
                                                             eps=EPS, max_token_num=max(tokens, 2048))
        if norm is None:
            out.append(None)
            continue
        want, want_res = sglang_unfused(ctx, x, residual, weight, dtype)
        out.append((torch.equal(host(res), want_res), torch.equal(host(rd), residual),
                    rel_err(host(norm), want), _same_on_every_rank(ctx, norm)))
    return out


def check_sglang_fused(results: list, dtype) -> None:
    for r in results:
        assert r is not None, "SGLang's fused entry was not served"
        residual_exact, untouched, err, same = r
        assert residual_exact and untouched and same
        assert err <= 2 ** -7 if dtype == torch.bfloat16 else err <= 2 ** -10, err
