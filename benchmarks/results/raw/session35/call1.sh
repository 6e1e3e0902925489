#!/usr/bin/env bash
# Session 35, call 1 (2 GPUs), tree 28e52bd: the MoE, EP and Lamport GPU tests (one loop per combine
# mode, the trickle-writer poll test: never run on a GPU before); then the role split at 1 / 8 / 128
# tokens (send_programs / push_programs, both shapes; 264 programs with 132 of each role) and routed packets at 512 / 4096 tokens
# (DeepSeek-V3), dispatch + combine in graphs (moe_variants, 3 rounds each).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py tests/kernels/test_lamport.py 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -4
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,send_programs=66,push_programs=66,send_programs=66+push_programs=66,programs=264+send_programs=132+push_programs=132
timeout 100 $M --tokens 1,8,128 --variants $V --json "$OUT/split-ds.json" 2>&1 | tail -8 | sed "s/^/split ds: /"
timeout 100 $M --tokens 1,8,128 --variants $V --shape qwen3-moe --json "$OUT/split-qwen.json" 2>&1 | tail -8 \
  | sed "s/^/split qwen: /"
timeout 100 $M --tokens 512,4096 --variants default,routed_packets=1 --json "$OUT/routed-ds.json" 2>&1 | tail -5 \
  | sed "s/^/routed ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
