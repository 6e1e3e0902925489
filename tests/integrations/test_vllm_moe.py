"""vLLM 0.33.0's own modular MoE kernel on tritoncomm's all-to-all, in the CPU world.

Each rank builds vLLM's ``FusedMoEKernel`` from ``TritonCommPrepareAndFinalize`` and vLLM's batched
experts with its slice of full weights that every rank creates alike, and runs vLLM's ``apply``;
the output is checked against ``moe_reference``, the layer in one process with the full weights.
Different token counts per rank (one rank with none), bf16 and FP8 dispatch (vLLM's block-quantised
experts), repeated calls. The experts are vLLM's ``NaiveBatchedExperts`` here (SwiGLU per expert in
torch; in the CPU world the probe for graph capture, which asks the accelerator, answers "no"); the
same jobs run on GPUs from ``test_engines_gpu.py`` with vLLM's ``BatchedTritonExperts``, the ones
its CUDA selection picks, where vLLM's CUDA platform also takes the combine's buffer for the
experts' output. The few ops of vLLM's compiled extension on this path, absent in both worlds, come
from ``vllm_extension``.

With ``TRITONCOMM_MOE=1`` vLLM builds the kernel itself: each rank runs vLLM's plugin loader, builds
vLLM's parallel config and groups for a data + expert parallel deployment, and asks vLLM's own
oracles (unquantized, FP8) for the kernel; the test checks what vLLM chose and the outputs.
"""

from __future__ import annotations

import pytest

from .enginetest import engine_world
from .vllm_moe_jobs import agrs_job, kernel_job, switch_job


@pytest.mark.parametrize("world,fp8,on_input", [(2, False, False), (3, False, False), (2, True, False),
                                                (2, False, True)])
def test_vllm_modular_kernel_on_tritoncomm_matches_reference(world, fp8, on_input):
    """vLLM's ``FusedMoEKernel.apply`` with tritoncomm's prepare/finalize and vLLM's batched experts
    gives the single-process layer's output on every rank (bf16 within 2%, FP8 rows and weights
    within 8%), for 0 to 8 tokens per rank over three calls; the experts' output buffer offered is
    the combine's own (for its shape only); an ``expert_map`` other than the instance's linear
    placement is refused before any rank waits. Also top-1 with the router weight applied to the
    input (``apply_router_weight_on_input``, as Llama 4 routes)."""
    tol = 0.08 if fp8 else 0.02
    with engine_world(world) as w:
        for errs, refused, aliased in w.run(kernel_job, fp8, on_input):
            assert max(errs) < tol, errs
            assert refused and aliased

@pytest.mark.parametrize("world", [2, 3])
def test_vllm_builds_tritoncomm_prepare_finalize_with_the_switch(world):
    """With ``TRITONCOMM_ENABLE=1 TRITONCOMM_MOE=1`` and vLLM's plugin loader, a data + expert parallel
    deployment (vLLM's parallel config and groups, default all-to-all backend): vLLM's MoE parallel
    config asks for batched-format experts, vLLM's own oracles (unquantized, FP8 blocks) build
    ``FusedMoEKernel``s whose prepare/finalize is tritoncomm's, two layers of one shape share one
    instance, each call (inside vLLM's forward context) is bounded by the most tokens of any rank,
    and their outputs match the single-process layer over repeated calls; tensor
    parallelism inside the MoE and expert load balancing keep vLLM's format; vLLM's destroy of the
    all-to-all manager closes the instances (bf16, then at 2 ranks FP8 on new instances). Micro-batching,
    elastic expert parallelism, monolithic experts and int8 activations are refused at build time."""
    with engine_world(world) as w:
        for fp8 in (False, True) if world == 2 else (False,):  # FP8 at 2 ranks, as the kernel test above
            for ours, built, shared, errs, others, left, _, refused in w.run(switch_job, fp8):
                assert ours and built and shared and all(refused), (ours, built, shared, refused)
                assert max(errs) < (0.08 if fp8 else 0.02), errs
                assert others == (False, False) and left == 0, (others, left)


# -- vLLM's default path: all-gather + reduce-scatter over the data-parallel group ---------------------
#: vLLM parallel configs -> (the data-parallel group carries the path, the expert-parallel group does)
CARRIERS = {"dp2": (True, False), "tp2 dp2 (sequence-parallel MoE)": (False, True), "dp2 pcp2": (False, True),
            "tp2": (False, False), "dp2 deepep": (False, False), "dp2, no EP": (False, False)}


@pytest.mark.parametrize("world", [2, 3])
def test_vllm_default_all_gather_reduce_scatter_served(world):
    """With ``TRITONCOMM_ENABLE=1`` vLLM's data-parallel group in a data + expert parallel
    deployment on its default all-to-all backend serves its MoE layers' ``all_gatherv`` and
    ``reduce_scatterv`` through tritoncomm (``integrations/vllm_agrs.py``), exactly; the group that
    gets it is the one vLLM's manager picks (on vLLM's own parallel configs)."""
    with engine_world(world) as w:
        for served, calls, ok, carriers in w.run(agrs_job):
            assert served and calls == [5, 5], calls  # four through vLLM, one past the bound
            assert all(all(o) for o in ok), ok
            assert carriers == CARRIERS, carriers
