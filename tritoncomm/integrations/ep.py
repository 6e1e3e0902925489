"""An expert-parallel mixture-of-experts layer: router, dispatch, local experts, combine.

``ExpertParallelMoE`` keeps the router (replicated) and this rank's experts, sliced from full
weights that every rank creates alike, so ``moe_reference`` with the full weights in one process is
the reference. ``forward(x [T, hidden])``:

1. router logits in fp32, softmax, top-k (renormalised over the k when ``renormalize``);
2. ``MoEAllToAll.dispatch`` (bf16, or FP8 with ``fp8_dispatch``, dequantised before the GEMMs);
3. each local expert, a SwiGLU MLP (``down(silu(gate(x)) * up(x))``), as batched GEMMs over all of
   its ``capacity`` rows: rows past an expert's count hold stale data and are computed and ignored
   (knowing the counts on the host would need a synchronisation), the down projection written
   straight into the combine's heap buffer;
4. ``MoEAllToAll.combine``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..channels import Communicator
from ..collectives import MoEAllToAll

__all__ = ["ExpertParallelMoE", "moe_reference", "route"]


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_ids int64 [T, k], topk_weights fp32 [T, k])`` from softmax over ``x @ router.T`` in fp32."""
    probs = torch.softmax(x.float() @ router.float().t(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def _expert(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ gate.t()) * (x @ up.t())) @ down.t()


def moe_reference(x: torch.Tensor, router: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                  top_k: int, renormalize: bool = True) -> torch.Tensor:
    """The layer in one process with the full weights (``gate``, ``up``: ``[E, I, H]``; ``down``:
    ``[E, H, I]``): ``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])``, summed in fp32."""
    ids, weights = route(x, router, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, j = (ids == e).nonzero(as_tuple=True)
        y = _expert(x[tok], gate[e], up[e], down[e]).float()
        out.index_add_(0, tok, weights[tok, j, None] * y)
    return out.to(x.dtype)


class ExpertParallelMoE(nn.Module):
    """See the module docstring. ``gate``/``up``: ``[num_experts, inter, hidden]``, ``down``:
    ``[num_experts, hidden, inter]``, ``router``: ``[num_experts, hidden]``, the full weights."""

    def __init__(self, comm: Communicator, router: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                 down: torch.Tensor, *, top_k: int, max_tokens: int, capacity: int | None = None,
                 renormalize: bool = True, fp8_dispatch: bool = False, mode: str = "auto") -> None:
        super().__init__()
        num_experts, _, hidden = gate.shape
        self.moe = MoEAllToAll(comm, max_tokens=max_tokens, hidden=hidden, num_experts=num_experts, top_k=top_k,
                               dtype=gate.dtype, capacity=capacity, fp8_dispatch=fp8_dispatch, mode=mode)
        local = self.moe.local_experts
        mine = slice(comm.rank * local, (comm.rank + 1) * local)
        dev = comm.device
        self.top_k, self.renormalize, self.dtype = top_k, renormalize, gate.dtype
        self.router = nn.Parameter(router.to(dev), requires_grad=False)
        # transposed once, for x [L, rows, H] @ w [L, H, I]
        self.gate_t = nn.Parameter(gate[mine].transpose(1, 2).contiguous().to(dev), requires_grad=False)
        self.up_t = nn.Parameter(up[mine].transpose(1, 2).contiguous().to(dev), requires_grad=False)
        self.down_t = nn.Parameter(down[mine].transpose(1, 2).contiguous().to(dev), requires_grad=False)

    def forward(self, x: torch.Tensor, tokens_bound: int | None = None) -> torch.Tensor:
        """The layer's output for this rank's tokens ``x``. ``tokens_bound``: as ``MoEAllToAll.dispatch``'s
        (a bound on every rank's token count in this call, the same on every rank)."""
        ids, weights = route(x, self.router, self.top_k, self.renormalize)
        h, _, handle = self.moe.dispatch(x, ids, weights, tokens_bound=tokens_bound)
        if isinstance(h, tuple):  # FP8: values and one scale per 128 columns
            q, scales = h
            h = (q.float().view(*q.shape[:-1], -1, 128) * scales[..., None]).view(q.shape).to(self.dtype)
        act = F.silu(torch.bmm(h, self.gate_t)) * torch.bmm(h, self.up_t)
        y = self.moe.expert_buffer()
        torch.bmm(act, self.down_t, out=y)
        return self.moe.combine(y, handle)

    def close(self) -> None:
        """Collective: release the dispatch/combine buffers."""
        self.moe.close()
