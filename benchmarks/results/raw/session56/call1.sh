#!/usr/bin/env bash
# Session 56, call 1, on nvidia-h200 (one GPU: the multi-GPU kinds are withheld this session). Correctness only:
# two ranks share the GPU (time-sliced; no NCCL between them), so nothing here is a timing.
# 1. vLLM 0.33 on CUDA with tritoncomm's MoE prepare/finalize (engines' pack carried): vLLM's FusedMoEKernel on our
#    prepare/finalize, and TRITONCOMM_MOE=1 in a data + expert parallel deployment of vLLM's config and groups.
#    Prediction: both pass; vLLM's CUDA selection picks BATCHED_TRITON and its batched Triton experts read our
#    layout (bf16, FP8 blocks). Risk: the selection imports modules the CPU-world trace did not pack.
# 2. The session-55 kernels on a GPU for the first time: the chunked combine (CPU-shape tests, graph replay with
#    new routing, stragglers: routed-chunked), the all-to-all (against NCCL where NCCL can run: skipped here; direct
#    against staged bits; graph replays against gloo), the backend's served and delegated all_to_all_single.
#    Prediction: all pass.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
SHARED=1 TEST_TIMEOUT=330 TAIL=20 bash scripts/gpu_engines.sh -k "moe"
TEST_TIMEOUT=230 TAIL=25 bash scripts/gpu_shared.sh tests/collectives/test_moe.py tests/collectives/test_allreduce.py \
  tests/channels/test_registered.py tests/integrations/test_backend.py -k "chunked or alltoall or all_to_all"
