#!/usr/bin/env bash
# Session 56, call 7, on nvidia-h200 (one GPU; two ranks share it: correctness only). vLLM's default expert-parallel
# path (AgRsAll2AllManager: all_gatherv of hidden states, fp32 weights, int32 ids; reduce_scatterv of the experts'
# outputs) through tritoncomm's AllGather / ReduceScatter with sizes= (VAR kernels), on CUDA for the first time.
# Prediction: passes (exact gathers, rank-order sums).
set -uo pipefail
source scripts/gpu_env.sh
SHARED=1 TEST_TIMEOUT=150 TAIL=12 bash scripts/gpu_engines.sh -k "default_all_gather"
