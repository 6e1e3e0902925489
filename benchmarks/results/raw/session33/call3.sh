#!/usr/bin/env bash
# Session 33, call 3 (2 GPUs): the prefill shape's columns per step (block_h 4096, the packaged one,
# against 2048, and 2048 with the send kept at 4096) at 128, 512 and 4096 tokens per rank, both
# shapes; DeepSeek-V3's dispatch alone beside them.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 12 --tokens 128,512,4096"
VARS=default,block_h=2048,block_h=2048+send_block_h=4096
timeout 200 $M --variants $VARS --json "$OUT/var-bh-ds.json" 2>&1 | tail -4 | tee "$OUT/var-bh-ds.log"
timeout 150 $M --variants $VARS --op dispatch --json "$OUT/var-bh-ds-dispatch.json" 2>&1 | tail -4 | tee "$OUT/var-bh-ds-dispatch.log"
timeout 150 $M --variants $VARS --shape qwen3-moe --json "$OUT/var-bh-qwen.json" 2>&1 | tail -4 | tee "$OUT/var-bh-qwen.log"
