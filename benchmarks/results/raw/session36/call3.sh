#!/usr/bin/env bash
# Session 36, call 3 (2 GPUs), tree 36a1750 (bounded routing copies on, PREFILL_FROM 48, decode_below
# = prefill_from, bench's engine column): the MoE and EP GPU tests; bench --op moe (both shapes,
# 1 / 8 / 128 / 512 / 4096 tokens per rank, every row checked; the engine column: one instance per
# shape sized for 4096 tokens, each call given tokens_bound).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
timeout 370 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-h100-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -42
