#!/usr/bin/env bash
# Session 53, call 3 (nvidia-h200-x4): the interleaved combine now on by default at EP4 on H200s from 4096 tokens
# per rank (COMBINE_INTERLEAVE_FROM_TOKENS_EP4), the interleaved send kernel (DeepSeek-V3 bf16) from 2048.
# (1) GPU tests of the interleaved combine at worlds 2 and 4 (with the new FP8 variant) and the default shape's test.
# (2) bench --op moe --world 4, both shapes at 1024-4096 tokens, the baselines in the same run (EP4 file's new
#     first report; the last EP4 bench, raw/session51/call1, predates both interleaves).
# (3) The FP8 DeepSeek-V3 dispatch at EP2 with the send interleave forced (call 2 timed out at 100 s).
# Prediction: (1) pass; (2) DeepSeek-V3 both phases about 590 / 1150 µs at 2048 / 4096 (session 51: 600.4 /
#     1171.7), Qwen3-MoE about 364 / 706 (721.6 at 4096), 1024 unchanged; (3) within 2% at 2048-4096.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2,4 timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved_throughput_combine or default_launch_shape" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"
timeout 300 python3 -m tritoncomm bench --op moe --world 4 --shapes deepseek-v3,qwen3-moe --tokens 1024,2048,4096 \
  --json "$OUT/moe-ep4.json" > "$OUT/moe-ep4.log" 2>&1
echo "bench rc=$?"
CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 benchmarks/experiments/moe_variants.py --rounds 2 --heap-gb 8 --world 2 \
  --shape deepseek-v3 --fp8 --tokens 2048,4096 --variants default,interleave_from=1 \
  --json "$OUT/ep2-ds-fp8-send.json" > "$OUT/ep2-ds-fp8-send.log" 2>&1; echo "fp8 rc=$?"
grep -E "tokens|deepseek|qwen|slow" "$OUT/moe-ep4.log" | head -20
tail -3 "$OUT/ep2-ds-fp8-send.log"
