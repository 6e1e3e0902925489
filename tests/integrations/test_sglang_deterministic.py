"""SGLang 0.5.23's deterministic inference (``SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1``, what
``--enable-deterministic-inference`` sets) through its own code, in the CPU world: SGLang keeps its
custom all-reduce slot in this mode, relying on a fixed reduction order, and tritoncomm serves it. A
row's bits are the same alone and inside batches of any size up to the slot's limit."""

from __future__ import annotations

import torch

from .enginetest import Spy, module_world
from .test_sglang import _tp, _up

sdet = module_world(_up, "sdet", {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"})

HIDDEN = 256


def _rows(ctx):
    tp = _tp()
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
