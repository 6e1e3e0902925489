#!/usr/bin/env bash
# For a later call (written in session 54, not run: the device minutes were spent), on nvidia-h200-x2, with the
# engines' pack carried (build it here first: `bash scripts/engines_gpu_pack.sh`, which now traces
# tests/integrations/test_vllm_moe.py too; carry ".engines"; the pack went up by einops).
# vLLM 0.33's own FusedMoEKernel with TritonCommPrepareAndFinalize and vLLM's NaiveBatchedExperts on two GPUs,
# bf16 and FP8 (test_engines_gpu.py::test_vllm_modular_moe_kernel_on_gpus), with the rest of the vLLM GPU tests.
# Prediction: passes; on vLLM's CUDA platform the experts write into the combine's own buffer (aliased).
set -uo pipefail
source scripts/gpu_env.sh
TEST_TIMEOUT=400 bash scripts/gpu_engines.sh -k "vllm" 2>&1 | tail -20
