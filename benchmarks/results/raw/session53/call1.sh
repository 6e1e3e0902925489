#!/usr/bin/env bash
# Session 53, call 1 (nvidia-h200-x4; EP2 runs on GPUs 0-1): MoEShape.combine_interleave_from (built in session 52,
# off by default, CPU-world tests only), the throughput combine's counterpart of the interleaved send kernel. Its
# GPU tests at worlds 2 and 4, then both phases in turn with the default (which has the send interleave on from 2048
# tokens), 2 rounds: EP2 DeepSeek-V3 and Qwen3-MoE at 1024-4096, EP4 DeepSeek-V3 at 2048 / 4096.
# Prediction (raw/session52/next-combine-interleave.sh): the tests pass; EP2 DeepSeek-V3 5-15 µs less at 4096,
# 2-6 at 2048, level or more at 1024; Qwen3-MoE level or more; EP4 DeepSeek-V3 10-30 µs less at 4096.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T="python3 -m pytest -q -p no:cacheprovider tests/collectives/test_moe.py -k interleaved_throughput_combine"
CUDA_VISIBLE_DEVICES=0,1 TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 80 $T > "$OUT/tests-2.log" 2>&1
tail -2 "$OUT/tests-2.log"
M="python3 benchmarks/experiments/moe_variants.py --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  CUDA_VISIBLE_DEVICES=0,1 timeout 110 $M --world 2 --shape $s --tokens 1024,2048,4096 \
    --variants default,combine_interleave_from=1 --json "$OUT/ep2-$s.json" > "$OUT/ep2-$s.log" 2>&1
  echo "ep2 $s rc $?"
done
timeout 120 $M --world 4 --shape deepseek-v3 --tokens 2048,4096 --variants default,combine_interleave_from=1 \
  --json "$OUT/ep4-deepseek-v3.json" > "$OUT/ep4-deepseek-v3.log" 2>&1; echo "ep4 rc $?"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 90 $T > "$OUT/tests-4.log" 2>&1
tail -2 "$OUT/tests-4.log"
for f in "$OUT"/ep*.log; do echo "== $f"; tail -4 "$f"; done
