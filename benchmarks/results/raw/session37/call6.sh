#!/usr/bin/env bash
# Session 37, call 6 (4 GPUs): the new MoE test (an expert twice in a row) on GPUs at world 2; then
# tune --op moe --world 4 for DeepSeek-V3 at 8 / 128 / 512 tokens per rank: where the combine's
# throughput mode starts to win at EP4 (the bench at 128 tokens: throughput 66.1 against latency 69.5).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "twice_in_a_row" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
timeout 220 python3 -m tritoncomm tune --op moe --world 4 --shapes deepseek-v3 --tokens 8,128,512 \
  --out "$OUT/moe-tune-h100-ep4.json" 2>&1 | tee "$OUT/moe-tune.log" | tail -14
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
