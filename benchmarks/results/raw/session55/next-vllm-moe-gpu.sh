#!/usr/bin/env bash
# For a later call (written in session 55, not run: no device minutes were left), on nvidia-h200-x2, with the
# engines' pack carried (build it here first: `PYTHON=<venv python> bash scripts/engines_gpu_pack.sh`, whose trace
# now runs the switch test of tests/integrations/test_vllm_moe.py too; carry ".engines"). Supersedes
# raw/session54/next-vllm-moe-gpu.sh.
# 1. vLLM 0.33's FusedMoEKernel with TritonCommPrepareAndFinalize and NaiveBatchedExperts on two GPUs, bf16 and FP8
#    (test_engines_gpu.py::test_vllm_modular_moe_kernel_on_gpus). Prediction: passes, experts' output aliased.
# 2. TRITONCOMM_MOE=1 in a data + expert parallel deployment of vLLM's config and groups
#    (test_vllm_chooses_tritoncomm_moe_on_gpus). Predictions: vLLM's own selection on its CUDA platform picks
#    BATCHED_TRITON; its oracles build kernels on our prepare/finalize; outputs within 2% (FP8 8%). Risk: the
#    selection imports modules the CPU-world trace did not pack (then the pack script needs them named).
# 3. The rest of the vLLM GPU tests, unchanged.
set -uo pipefail
source scripts/gpu_env.sh
TEST_TIMEOUT=400 bash scripts/gpu_engines.sh -k "vllm" 2>&1 | tail -25
