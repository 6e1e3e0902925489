#!/usr/bin/env bash
# Session 41, call 5 (2 GPUs): the combine's default switch in elements received (default_throughput_from: 659
# total tokens for DeepSeek-V3 at EP2, 1152 for Qwen3-MoE) around its EP2 boundaries. Both phases in turn:
# default / mode=latency / mode=throughput; GPU tests of the automatic switch at world 2.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "auto_mode or stragglers or default_combine_switch" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 12"
V=default,mode=latency,mode=throughput
timeout 150 $M --rounds 3 --shape deepseek-v3 --tokens 256,384,512 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -4 | sed "s/^/ds: /"
timeout 170 $M --rounds 3 --shape qwen3-moe --tokens 512,640,768,1024 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -5 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
