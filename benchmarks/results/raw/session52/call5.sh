#!/usr/bin/env bash
# Session 52, call 5 (nvidia-h200-x4, warm after call 4): EP4, DeepSeek-V3, both phases, interleave_from=1 in turn
# with the default, 2 rounds, 2048 / 4096 tokens; then the interleaved send kernel's GPU tests at world 4.
# Prediction: 2-4% less at both counts (call 4: the dispatch alone 3.6% / 4.8% less).
source scripts/gpu_env.sh; V="benchmarks/experiments/moe_variants.py --rounds 2 --heap-gb 8"
timeout 110 python3 $V --world 4 --shape deepseek-v3 --tokens 2048,4096 --variants default,interleave_from=1 \
  --json "$OUT/ep4-interleave-both.json" > "$OUT/ep4-interleave-both.log" 2>&1; echo "rc=$?"
tail -4 "$OUT/ep4-interleave-both.log"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved" 2>&1 | tail -3
