#!/usr/bin/env bash
# Session 52, call 4 (nvidia-h200-x4, lent again at 15:45). The interleaved send kernel is on by default for wide
# bf16 rows at EP2 on H200s from 2048 tokens per rank (INTERLEAVE_FROM_TOKENS_EP2).
# (1) GPU tests: the interleaved send kernel at world 2 and 4, MoEShape.pairs_across at world 4 (first GPU run).
# (2) bench --op moe at EP2 (GPUs 0-1) for DeepSeek-V3 at 1024-4096 tokens, the baselines in the same run.
# (3) EP4: interleave_from=1 against the default, the dispatch alone, 2 rounds, DeepSeek-V3 at 1024-4096.
# (4) EP4: pairs_across against the default, both phases, 2 rounds, Qwen3-MoE at 256-512 (session 51's script).
# Prediction: (2) DeepSeek-V3 dispatch about 120 / 231 µs at 2048 / 4096 (session 51's table: 127.2 / 244.6), both
# phases about 249 / 481 (253.4 / 491.4), 1024 and the FP8 column unchanged. (3) 3-5% less at 2048-4096 (three
# peers' rows to lay out after the barrier), level or more at 1024. (4) 3-6 µs less at 256-512.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2,4 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved or paired_across" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
CUDA_VISIBLE_DEVICES=0,1 timeout 170 python3 -m tritoncomm bench --op moe --world 2 --shapes deepseek-v3 \
  --tokens 1024,2048,4096 --json "$OUT/moe-dsv3-ep2.json" > "$OUT/moe-ep2.log" 2>&1
echo "bench rc=$?"
V="benchmarks/experiments/moe_variants.py --rounds 2 --heap-gb 8"
timeout 120 python3 $V --world 4 --shape deepseek-v3 --tokens 1024,2048,4096 --op dispatch \
  --variants default,interleave_from=1 --json "$OUT/ep4-interleave.json" > "$OUT/ep4-interleave.log" 2>&1
echo "ep4 interleave rc=$?"
timeout 100 python3 $V --world 4 --shape qwen3-moe --tokens 256,384,512 --variants default,pairs_across=1 \
  --json "$OUT/ep4-across.json" > "$OUT/ep4-across.log" 2>&1
echo "ep4 across rc=$?"
grep -E "tokens|DeepSeek|deepseek|slow" "$OUT/moe-ep2.log" | head -20
for f in ep4-interleave ep4-across; do echo "== $f"; tail -5 "$OUT/$f.log"; done
