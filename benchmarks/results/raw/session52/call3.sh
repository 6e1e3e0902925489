#!/usr/bin/env bash
# Session 52, call 3 (nvidia-h200-x2): call 2's GPU test of the interleaved send kernel failed at world 2 without
# the route kernel's barrier (plain and FP8; the direct rows passed): each program read the peers' token counts
# before its wait at the half slot, and so could take a stale count. Now it sends one item more after its arrival,
# waits, then reads them. The MoE two-kernel and interleaved GPU tests at world 2 in full, then moe_variants in
# turn with the default, 2 rounds: the dispatch alone at 1024-4096 tokens, both phases at 2048 / 4096.
# Prediction: the tests pass; the dispatch as in call 2 within 1-2 µs (DeepSeek-V3 about 13 µs less at 4096 and
# 7 at 2048; Qwen3-MoE about 2 less at 4096, more at 1024).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved or two_kernel_dispatch" -x 2>&1 | tail -25 > "$OUT/gpu-tests.log"
tail -3 "$OUT/gpu-tests.log"
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  timeout 90 $M --shape $s --tokens 1024,2048,4096 --op dispatch --variants default,interleave_from=1 \
    --json "$OUT/dispatch-$s.json" > "$OUT/dispatch-$s.log" 2>&1; echo "dispatch $s rc $?"
  timeout 90 $M --shape $s --tokens 2048,4096 --variants default,interleave_from=1 \
    --json "$OUT/both-$s.json" > "$OUT/both-$s.log" 2>&1; echo "both $s rc $?"
done
for f in "$OUT"/dispatch-*.log "$OUT"/both-*.log; do echo "== $f"; tail -4 "$f"; done
