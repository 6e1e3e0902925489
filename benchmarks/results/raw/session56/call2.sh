#!/usr/bin/env bash
# Session 56, call 2, on nvidia-h200 (one GPU; two ranks share it: correctness only, nothing timed).
# Call 1 found vLLM's MoE modules failing to import on CUDA without vLLM's compiled extension (a capability
# probe of its CUTLASS kernels on import). The tests now define stand-ins for the extension's ops on the MoE
# path (tests/integrations/vllm_extension.py) and run vLLM's BatchedTritonExperts on GPUs.
# 1. Every engine GPU test (vLLM and SGLang). Prediction: all pass; vLLM's Triton batched experts read our
#    layout (bf16 within 2%, FP8 within 8% of the one-process layer), vLLM's CUDA selection picks BATCHED_TRITON.
#    Risk: a module or dependency on vLLM's CUDA import path that the CPU-world trace did not pack.
# 2. The MoE and registered-output GPU tests at world 2 (graph replays with new routing, stragglers, every path).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
SHARED=1 TEST_TIMEOUT=300 TAIL=30 bash scripts/gpu_engines.sh
TEST_TIMEOUT=240 TAIL=12 MAXFAIL=4 bash scripts/gpu_shared.sh tests/collectives/test_moe.py tests/channels/test_registered.py
