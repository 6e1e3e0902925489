#!/usr/bin/env bash
# For a later call (written in session 56, not run: only one GPU was lent), on nvidia-h200-x2, engines' pack carried.
# 1. GPU tests of all_gatherv / reduce_scatterv (AllGather / ReduceScatter with sizes=, VAR kernels) at world 2, and
#    vLLM's default expert-parallel path through them (test_vllm_default_all_gather_reduce_scatter_on_gpus).
# 2. benchmarks/experiments/gatherv.py: vLLM's AgRs exchange (all_gatherv of hidden 7168 bf16 + fp32 weights + int32
#    ids, reduce_scatterv) through tritoncomm against NCCL's uneven list collectives, 8-1024 tokens per rank.
# Prediction: tritoncomm about (c) of moe.md's EP2 H200 table (DeepSeek-V3 12.9 / 26.0 / 145.1 µs at 8 / 128 / 1024
# tokens, equal counts) plus a few µs for the weights and ids (two more launches); NCCL's uneven path slower than its
# equal (b) (49.6 / 90.7 / 209.0): grouped broadcasts and reduces instead of one all-gather and one reduce-scatter.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_gatherv.py tests/integrations/test_backend.py -k "gatherv or scatterv or uneven" 2>&1 | tail -2
TEST_TIMEOUT=200 TAIL=4 bash scripts/gpu_engines.sh -k "default_all_gather"
timeout 240 python3 benchmarks/experiments/gatherv.py --world 2 --tokens 8,128,512,1024 --json "$OUT/gatherv-ep2.json" \
  2>&1 | tail -10
