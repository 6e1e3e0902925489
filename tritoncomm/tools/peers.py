"""The baselines engines and users run instead of tritoncomm, ready to time beside it.

* torch symmetric memory's one-shot and two-shot all-reduce (``symm_mem_ops``);
* FlashInfer's TensorRT-LLM all-reduce and fused all-reduce + residual + RMSNorm (+ FP8), called as
  vLLM calls them (``FlashInferAllReduce``);
* FlashInfer's port of vLLM's custom all-reduce, with its input registered as in vLLM's CUDA graphs
  (``VllmCustomAllReduce``).

FlashInfer is optional (``pip install tritoncomm[peers]``; on the project's GPU machines a ready copy,
see ``../shared/peers/README.md``). Each set-up is collective; a baseline that cannot be set up says
why (``why_not``) instead of raising, and the benchmarks print "not installed" / the reason in its
columns. These are benchmarks' baselines, never a code path of the library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..integrations.tp import Reducer
from ..launch import RankContext

__all__ = ["FlashInferAllReduce", "FlashInferReducer", "VllmCustomAllReduce", "flashinfer_missing", "symm_mem_ops"]

#: Vector width of FlashInfer's kernels, in bf16 elements: a row's length must be a multiple of it.
_FI_VEC = 8
#: The row length the benchmarks give FlashInfer (hidden size of a 70B-class model).
FI_HIDDEN = 8192


def flashinfer_missing() -> str | None:
    """None when FlashInfer's comm modules import here, else why not."""
    try:
        import flashinfer.comm.allreduce
        import flashinfer.comm.trtllm_ar  # noqa: F401
    except Exception as e:  # not installed, or its compiled modules do not load
        return f"not installed ({type(e).__name__}: {str(e)[:120]})"
    return None


def symm_mem_ops(ctx: RankContext, n: int, dtype: torch.dtype) -> dict[str, Any]:
    """torch symmetric-memory one-shot / two-shot all-reduce callables on a fresh symmetric buffer."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = ctx.group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(name)
            except Exception:
                pass
        buf = symm_mem.empty(n, dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(buf, name)
    except Exception as e:  # not available in this torch / on this device
        return {"error": f"{type(e).__name__}: {e}"}
    ops: dict[str, Any] = {"buf": buf}
    ops["one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name)
    ops["two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", name)
    return ops


def fi_shape(n: int, hidden: int = FI_HIDDEN) -> tuple[int, int] | None:
    """(tokens, hidden) for ``n`` elements as FlashInfer takes them (2-D, rows a multiple of its vector
    width), or None."""
    if n >= hidden and n % hidden == 0:
        return n // hidden, hidden
    if n < hidden and n % _FI_VEC == 0:
        return 1, n
    return None


class FlashInferAllReduce:
    """FlashInfer's TRT-LLM all-reduce and fused add-RMSNorm, with the arguments vLLM passes
    (``FlashInferAllReduce`` and the all-reduce fusion pass): one workspace for up to ``max_tokens`` x
    ``hidden`` bf16 elements, made once (collective over ``ctx.group``); launches with PDL."""

    def __init__(self, ctx: RankContext, max_tokens: int, hidden: int = FI_HIDDEN) -> None:
        self.why_not = flashinfer_missing()
        self.ws = None
        if self.why_not:
            return
        import flashinfer.comm.allreduce as fa
        import flashinfer.comm.trtllm_ar as tr

        self._fa, self._p = fa, tr.AllReduceFusionPattern
        try:
            self.ws = fa.create_allreduce_fusion_workspace(
                backend="trtllm", world_size=ctx.world, rank=ctx.rank, max_token_num=max_tokens, hidden_dim=hidden,
                dtype=torch.bfloat16, group=ctx.group)
        except Exception as e:
            self.why_not = f"workspace: {type(e).__name__}: {str(e)[:160]}"
        self.world = ctx.world

    def allreduce(self, x2d: torch.Tensor, out: torch.Tensor, use_oneshot: bool | None) -> Callable[[], object]:
        """A call of its all-reduce on ``x2d`` (tokens, hidden) into ``out``: ``use_oneshot`` None lets
        FlashInfer choose, False forces the two-shot, True the one-shot."""
        tokens = x2d.shape[0]

        def run() -> object:
            return self._fa.allreduce_fusion(input=x2d, workspace=self.ws, pattern=self._p.kAllReduce, output=out,
                                             launch_with_pdl=True, trigger_completion_at_end=tokens > 16,
                                             use_oneshot=use_oneshot)
        return run

    def add_rms_norm(self, x2d: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor,
                     norm_out: torch.Tensor, gamma: torch.Tensor, eps: float,
                     fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> Callable[[], object]:
        """A call of its fused ``residual_out = residual + all_reduce(x2d)``, ``norm_out =
        rmsnorm(residual_out) * gamma`` (with ``fp8 = (quant_out, scale)``: the static-scale FP8
        pattern, ``quant_out`` e4m3), as vLLM's fusion pass calls it (fp32 accumulation, one-shot up
        to 32 MB)."""
        tokens, hidden = x2d.shape
        oneshot = tokens * hidden * x2d.element_size() <= 32 << 20
        kw: dict[str, Any] = dict(input=x2d, workspace=self.ws, launch_with_pdl=True,
                                  trigger_completion_at_end=tokens > 16, residual_in=residual,
                                  residual_out=residual_out, rms_gamma=gamma, rms_eps=eps, fp32_acc=True,
                                  use_oneshot=oneshot)
        if fp8 is None:
            kw.update(pattern=self._p.kARResidualRMSNorm, norm_out=norm_out)
        else:
            kw.update(pattern=self._p.kARResidualRMSNormFP8Quant, quant_out=fp8[0], scale_factor=fp8[1])

        def run() -> object:
            return self._fa.allreduce_fusion(**kw)
        return run

    def close(self) -> None:
        if self.ws is not None:
            self.ws.destroy()
            self.ws = None


class VllmCustomAllReduce:
    """FlashInfer's port of vLLM's custom all-reduce (``flashinfer.comm.vllm_ar``), set up as vLLM does
    (a shared buffer of ``meta_size() + max_bytes`` per rank, ``init_custom_ar``, ``register_buffer``).
    Eager calls copy the input into the registered buffer; calls captured in a CUDA graph read the
    graph's input in place once ``register_graph`` (collective) has run after the capture, as vLLM's
    ``capture()`` does."""

    CTAS = 36

    def __init__(self, ctx: RankContext, max_bytes: int) -> None:
        self.why_not = flashinfer_missing()
        self.fa = None
        self.ctx, self.max_bytes = ctx, max_bytes
        if self.why_not:
            return
        try:
            import flashinfer.comm.cuda_ipc as ipc
            import flashinfer.comm.vllm_ar as var

            self._var, self._ipc = var, ipc
            self.meta = ipc.create_shared_buffer(var.meta_size() + max_bytes, group=ctx.cpu_group)
            self.buffers = ipc.create_shared_buffer(max_bytes, group=ctx.cpu_group)
            self.rank_data = torch.empty(8 << 20, dtype=torch.uint8, device=ctx.device)
            torch.cuda.synchronize()
            self.fa = var.init_custom_ar(self.meta, self.rank_data, ctx.rank, True)
            var.register_buffer(self.fa, self.buffers)
        except Exception as e:
            self.why_not = f"{type(e).__name__}: {str(e)[:160]}"

    def allreduce(self, x: torch.Tensor, out: torch.Tensor) -> Callable[[], object]:
        def run() -> object:
            if torch.cuda.is_current_stream_capturing():
                return self._var.all_reduce(self.fa, x, out, 0, 0, self.CTAS)
            return self._var.all_reduce(self.fa, x, out, self.buffers[self.ctx.rank], self.max_bytes, self.CTAS)
        return run

    def register_graph(self) -> None:
        """Collective, after a capture: map every rank's captured inputs (vLLM's ``register_graph_buffers``)."""
        handle, offsets = self._var.get_graph_buffer_ipc_meta(self.fa)
        all_meta: list[Any] = [None] * self.ctx.world
        dist.all_gather_object(all_meta, (handle, offsets), group=self.ctx.cpu_group)
        self._var.register_graph_buffers(self.fa, [m[0] for m in all_meta], [m[1] for m in all_meta])

    def close(self) -> None:
        if self.fa is not None:
            torch.cuda.synchronize()
            self._var.dispose(self.fa)
            self._ipc.free_shared_buffer(self.meta, group=self.ctx.cpu_group)
            self._ipc.free_shared_buffer(self.buffers, group=self.ctx.cpu_group)
            self.fa = None


class FlashInferReducer(Reducer):
    """The decoder's reductions as an engine with FlashInfer runs them: every all-reduce followed by a
    norm through its fused all-reduce + residual + RMSNorm, the others through its all-reduce."""

    def __init__(self, ctx: RankContext, max_tokens: int, hidden: int) -> None:
        self.rank, self.world = ctx.rank, ctx.world
        self.fi = FlashInferAllReduce(ctx, max_tokens, hidden)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1]
        out = torch.empty_like(x)
        self.fi.allreduce(x.view(-1, h), out.view(-1, h), None)()
        x.copy_(out)
        return x

    def add_rms_norm(self, partial, residual, weight, eps):
        h = partial.shape[-1]
        norm = torch.empty_like(partial)
        x2, r2 = partial.reshape(-1, h), residual.view(-1, h)
        self.fi.add_rms_norm(x2, r2, r2, norm.view(-1, h), weight, eps)()
        return norm

    def close(self) -> None:
        self.fi.close()
