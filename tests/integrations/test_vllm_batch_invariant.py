"""vLLM 0.33.0's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) through its own code, in the CPU world:
vLLM asks its custom all-reduce at every size, relying on a fixed reduction order, and tritoncomm's slot
serves it. A row's bits are the same alone and inside batches of any size, past the slot's capacity
too (served in pieces)."""

from __future__ import annotations

import torch

from .enginetest import Spy, module_world
from .test_vllm import _up

vbi = module_world(_up, "vbi", {"VLLM_BATCH_INVARIANT": "1"})

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
