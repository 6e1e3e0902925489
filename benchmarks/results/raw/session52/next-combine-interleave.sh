#!/usr/bin/env bash
# For a later call (written in session 52, not run: the device minutes were spent), on nvidia-h200-x2 (then x4 with
# --world 4): MoEShape.combine_interleave_from (off by default), the throughput combine's counterpart of the
# interleaved send kernel: each program pushes the first half of its partials, arrives at a half slot, then sums
# the first half of its own tokens in full (their peers' partials came in the peers' first halves) while it
# pushes its second half; the rest after its barrier. Built in session 52, CPU-world tests only (worlds 2-4).
# On two H200s the combine at 4096 tokens (DeepSeek-V3) takes 253 µs; on two H100s its sums after the barrier took
# about 70 µs of some 300 (docs/moe.md, "Where the prefill time goes").
# Prediction: both phases DeepSeek-V3 5-15 µs less at 4096 tokens, 2-6 at 2048, level or more at 1024; Qwen3-MoE
# level or more (as with the dispatch's interleave).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 90 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleaved" 2>&1 | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  timeout 120 $M --shape $s --tokens 1024,2048,4096 --variants default,combine_interleave_from=1 2>&1 | tail -4
done
