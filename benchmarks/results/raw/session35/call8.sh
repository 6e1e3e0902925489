#!/usr/bin/env bash
# Session 35, call 8 (2 GPUs), tree of 9a0d818 + moe_variants' "decode" change: call 7 compared
# nothing (moe_variants passes a shape, which turns the default decode_shape off). Calls with
# tokens_bound on instances sized for 4096 tokens: the instance's prefill shape (bound) against
# the decode shape (bound+decode), dispatch + combine in graphs, at 1 / 8 / 64 tokens.
set -uo pipefail
source scripts/gpu_env.sh
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,64 --max-tokens 4096 --variants bound,bound+decode"
timeout 60 $M --json "$OUT/ds.json" 2>&1 | tail -4
timeout 60 $M --shape qwen3-moe --json "$OUT/qwen.json" 2>&1 | tail -4
