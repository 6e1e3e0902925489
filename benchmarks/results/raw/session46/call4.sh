#!/usr/bin/env bash
# Session 46, call 4 (2 GPUs, warm after call 3): the MoE GPU tests at world 2 with the paired layout (pairs where
# every program has two rows or more of a source), then that rule against paired_layout=0, in turn, 2 rounds.
# Prediction (written before the call): tests pass; DeepSeek-V3 512 even (no pairs there now), 4096 about 5 µs
# faster with pairs (call 2: 488.9 against 494.6), Qwen3-MoE 4096 likewise (298.3 against 303.6).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,paired_layout=0"
timeout 100 $M --shape deepseek-v3 --tokens 512,4096 --json "$OUT/ds.json" 2>&1 | tail -3 | sed "s/^/ds: /"
timeout 80 $M --shape qwen3-moe --tokens 1024,4096 --json "$OUT/q.json" 2>&1 | tail -3 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
