#!/usr/bin/env bash
# Session 46, call 1 (2 GPUs): the routed send's first row per program sent to the peers before the route kernel
# has ended (MoEShape.early_items, 1 by default) against early_items=0 (the tree before) and 2, in turn, 2 rounds,
# both phases; then the bench for Qwen3-MoE at 384 / 512 / 4096 against the baselines; then the MoE GPU tests at
# world 2 (the routed, lookahead, sentinel and push_programs=0 paths).
# Prediction (written before the call): the route kernel's 3.2 µs before the send starts leave the links idle; with
# 264 of 384 rows going out then, early_items=1 takes 1.5-2.5 µs off at 384 and 512 tokens (Qwen3-MoE 46.6 -> about
# 44.5, DeepSeek-V3 68.4 -> about 66.5), even (within 1 µs) at 4096; 2 no better than 1 at 384 (more rows early but
# the own layout of the first two rows later). The bench: Qwen3-MoE at 384 ahead of (c) (about 44.5 against 46.0).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,early_items=0,early_items=2"
timeout 120 $M --shape qwen3-moe --tokens 384,512,4096 --json "$OUT/q.json" 2>&1 | tail -4 | sed "s/^/q: /"
timeout 100 $M --shape deepseek-v3 --tokens 384,512,4096 --json "$OUT/ds.json" 2>&1 | tail -4 | sed "s/^/ds: /"
timeout 150 python3 -m tritoncomm bench --op moe --world 2 --shapes qwen3-moe --tokens 384,512,4096 \
  --json "$OUT/moe-q.json" 2>&1 | tee "$OUT/moe.log" | grep -E " both |MoE|NO"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or direct or graph or stragglers or slots_past or sentinel" 2>&1 | tail -3
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
