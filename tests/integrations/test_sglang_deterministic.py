"""SGLang 0.5.23's deterministic inference (``SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1``, what
``--enable-deterministic-inference`` sets) through its own code, in the CPU world: SGLang keeps its
custom all-reduce slot in this mode, relying on a fixed reduction order, and tritoncomm serves it. A
row's bits are the same alone and inside batches of any size up to the slot's limit."""

from __future__ import annotations

import torch

from .enginesetup import sglang_tp, sglang_up
from .enginetest import Spy, module_world

sdet = module_world(sglang_up, "sdet", {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"})

HIDDEN = 256


def _rows(ctx):
    tp = sglang_tp()
    ca = tp.ca_comm
    spy = Spy(ca, "custom_all_reduce")
    row = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(11 + ctx.rank)).to(torch.bfloat16)
    most = ca.max_size // (HIDDEN * 2) - 1  # the most rows the slot takes (below max_size, as SGLang asks)
    bits, methods = {}, set()
    try:
        for batch in (1, 3, 64, most):
            for at in sorted({0, batch - 1}):
                x = (torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(batch + ctx.rank)) * 4).to(
                    torch.bfloat16)
                x[at] = row
                methods.add(tp._resolve_outplace_all_reduce_method(x))
                bits[(batch, at)] = tp._all_reduce_out_place(x, "auto")[at].view(torch.int16).clone()
        return (type(ca).__name__, tp._deterministic_collectives_enabled(), methods, spy.calls, len(bits), bits)
    finally:
        spy.close()


def test_a_rows_bits_follow_not_the_batch_in_sglangs_deterministic_mode(sdet):
    for name, deterministic, methods, served, n, bits in sdet.run(_rows):
        assert name == "SGLangCustomAllreduce" and deterministic, (name, deterministic)
        assert methods == {"ca"} and served == n, (methods, served, n)  # tritoncomm served every batch
        first = bits[(1, 0)]
        for key, b in bits.items():
            assert torch.equal(b, first), key


def _fused_rows(ctx):
    """SGLang's ``flashinfer_allreduce_residual_rmsnorm`` (hooked by the plugin) with a row in batches of
    1, 3 and 64: the row's norm and new residual bits per (batch, position), and the fused op's mode."""
    import sglang.srt.layers.flashinfer_comm_fusion as fc

    tp = sglang_tp()
    h = 64
    row = torch.randn(h, generator=torch.Generator().manual_seed(21 + ctx.rank)).to(torch.bfloat16)
    res_row = torch.randn(h, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    w = torch.randn(h, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(ctx.device)
    bits = {}
    for batch in (1, 3, 64):
        for at in sorted({0, batch - 1}):
            g = torch.Generator().manual_seed(batch + ctx.rank)
            x = (torch.randn(batch, h, generator=g) * 4).to(torch.bfloat16)
            res = torch.randn(batch, h, generator=torch.Generator().manual_seed(batch)).to(torch.bfloat16)
            x[at], res[at] = row, res_row
            norm, new_res = fc.flashinfer_allreduce_residual_rmsnorm(
                input_tensor=x.to(ctx.device), residual=res.to(ctx.device), weight=w, eps=1e-6, max_token_num=8)
            bits[(batch, at)] = None if norm is None else (norm[at].view(torch.int16).cpu().clone(),
                                                           new_res[at].view(torch.int16).cpu().clone())
    return tp.ca_comm.fused.batch_invariant, bits


def test_a_rows_bits_follow_not_the_batch_through_sglangs_fused_norm_in_deterministic_mode(sdet):
    """In deterministic inference the plugin serves SGLang's fused all-reduce + add-RMSNorm entry with
    batch-invariant rows: the row's norm and new residual have the same bits alone and in batches of 3 and
    64 (the fused op set up again for the larger batch)."""
    for invariant, bits in sdet.run(_fused_rows):
        assert invariant
        assert all(b is not None for b in bits.values()), "SGLang's fused entry was not served"
        first = bits[(1, 0)]
        for key, (norm, res) in bits.items():
            assert torch.equal(res, first[1]) and torch.equal(norm, first[0]), key
