#!/usr/bin/env bash
# Session 52, call 2 (nvidia-h200-x2): MoEShape.interleave_from on the present kernels (the design of e8971b8,
# which call 1 measured on its own tree at 15.4 µs less for the DeepSeek-V3 dispatch at 4096 tokens on H200s,
# 5.3 less for Qwen3-MoE, 3.3 / 1.1 less at 2048, 4.5 / 3.8 more at 512). Its GPU test at world 2 first; then
# moe_variants, in turn with the default, 2 rounds: the dispatch alone and both phases, 512-4096 tokens.
# Prediction: dispatch DeepSeek-V3 244.6 -> about 230 µs at 4096 tokens, Qwen3-MoE 153.8 -> about 149; level or
# a little less at 2048; 3-5 µs more at 512. Both phases: the dispatch's gain (the combine is untouched).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 80 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved or two_kernel_dispatch" 2>&1 | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  timeout 110 $M --shape $s --tokens 512,1024,2048,4096 --op dispatch --variants default,interleave_from=1 \
    --json "$OUT/dispatch-$s.json" > "$OUT/dispatch-$s.log" 2>&1; echo "dispatch $s rc $?"
  timeout 110 $M --shape $s --tokens 1024,2048,4096 --variants default,interleave_from=1 \
    --json "$OUT/both-$s.json" > "$OUT/both-$s.log" 2>&1; echo "both $s rc $?"
done
for f in "$OUT"/dispatch-*.log "$OUT"/both-*.log; do echo "== $f"; tail -6 "$f"; done
