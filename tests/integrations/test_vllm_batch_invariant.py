"""vLLM 0.33.0's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) through its own code, in the CPU world:
vLLM asks its custom all-reduce at every size, relying on a fixed reduction order, and tritoncomm's slot
serves it. A row's bits are the same alone and inside batches of any size, past the slot's capacity
too (served in pieces)."""

from __future__ import annotations

import torch

from .enginesetup import vllm_up
from .enginetest import Spy, module_world

vbi = module_world(vllm_up, "vbi", {"VLLM_BATCH_INVARIANT": "1"})

HIDDEN = 256


def _rows(ctx):
    import vllm.distributed.parallel_state as ps

    tp = ps.get_tp_group()
    ca = tp.device_communicator.ca_comm
    spy = Spy(ca, "custom_all_reduce")
    row = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(11 + ctx.rank)).to(torch.bfloat16)
    past = ca.max_size // (HIDDEN * 2) + 3  # rows of a batch past the slot's capacity (and its max_size)
    bits = {}
    try:
        for batch in (1, 3, 64, past):
            for at in sorted({0, batch - 1}):
                x = (torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(batch + ctx.rank)) * 4).to(
                    torch.bfloat16)
                x[at] = row
                bits[(batch, at)] = tp.all_reduce(x)[at].view(torch.int16).clone()
        return type(ca).__name__, ca.batch_invariant, spy.calls, len(bits), bits
    finally:
        spy.close()


def test_a_rows_bits_follow_not_the_batch_in_vllms_batch_invariant_mode(vbi):
    for name, invariant, served, n, bits in vbi.run(_rows):
        assert name == "TritonCommCustomAllreduce" and invariant, (name, invariant)
        assert served == n, "vLLM did not ask tritoncomm for every size"
        first = bits[(1, 0)]
        for key, b in bits.items():
            assert torch.equal(b, first), key


def _fused_rows(ctx):
    """vLLM's all-reduce + RMSNorm layers (``rankchecks.vllm_layers``) traced per batch size and rewritten by
    tritoncomm's fusion pass, as vLLM compiles a graph per size; the fused op set up for 8 rows, so that
    the batch of 20 takes the local path (the all-reduce, then the batch-invariant add + RMSNorm). The row
    under test's four outputs per (batch, position), and how often each path served."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from vllm.config import get_current_vllm_config
    from vllm.distributed import get_tp_group

    from tritoncomm.integrations.vllm_fusion import TritonCommFusionPass

    from .rankchecks import HIDDEN as H
    from .rankchecks import vllm_layers

    fusion = TritonCommFusionPass(get_current_vllm_config(), hidden=H, max_tokens=8, dtype=torch.bfloat16)
    ca = get_tp_group().device_communicator.ca_comm
    spies = Spy(ca, "fused_add_rms_norm"), Spy(ca, "invariant_add_rms_norm")
    layers = vllm_layers(False)
    w = torch.randn(H, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(ctx.device)
    rows = [torch.randn(H, generator=torch.Generator().manual_seed(50 + 10 * i + ctx.rank)).to(torch.bfloat16)
            for i in range(3)]
    bits = {}
    try:
        for batch in (1, 3, 8, 20):
            example = [torch.randn(batch, H, dtype=torch.bfloat16, device=ctx.device) for _ in range(3)]
            gm = make_fx(layers, tracing_mode="fake")(*example, w, None)
            fusion(gm.graph)
            gm.recompile()
            for at in sorted({0, batch - 1}):
                xs = []
                for i in range(3):
                    g = torch.Generator().manual_seed(1000 * batch + 10 * at + i + 100 * ctx.rank)
                    x = (torch.randn(batch, H, generator=g) * 3).to(torch.bfloat16)
                    x[at] = rows[i]
                    xs.append(x.to(ctx.device))
                bits[(batch, at)] = [t[at].view(torch.int16).cpu().clone() for t in gm(*xs, w, None)]
        return fusion.matched_count, [s.calls for s in spies], bits
    finally:
        for s in spies:
            s.close()


def test_a_rows_bits_follow_not_the_batch_through_vllms_fused_norm_in_batch_invariant_mode(vbi):
    """With ``VLLM_BATCH_INVARIANT=1`` the fusion pass serves vLLM's all-reduce + RMSNorm patterns with the
    batch-invariant fused op: a row's four outputs (first layer's norm, the fused add + norm and its new
    residual, the last layer's norm) have the same bits alone and in batches of 3, 8 (the fused kernel's
    largest) and 20 (the local path past it)."""
    for matched, (fused_calls, invariant_calls), bits in vbi.run(_fused_rows):
        assert matched == 3, matched  # three patterns in the last graph, as in every one
        assert invariant_calls == 3 * 2, invariant_calls  # the batch of 20: three layers, two positions
        assert fused_calls == 3 * (1 + 2 + 2), fused_calls  # batches 1, 3 and 8
        first = bits[(1, 0)]
        for key, outs in bits.items():
            for k, (a, b) in enumerate(zip(outs, first, strict=True)):
                assert torch.equal(a, b), (key, k, (a != b).nonzero().flatten()[:8].tolist())
