#!/usr/bin/env bash
# Session 37, call 1 (2 GPUs): the MoE and EP GPU tests with a 300 s timeout (session 36's call 6 cut
# them at 200 s); stage stamps of the one-kernel dispatch at 256 / 512 tokens with 4096 routing
# entries allowed in one kernel (why 512 tokens lose there), DeepSeek-V3.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 300 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
timeout 120 python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 256,512 --one-kernel-entries 4096 \
  --json "$OUT/trace.json" 2>&1 | tee "$OUT/trace.log" | grep -E "tokens/rank|dispatch \[|combine \[" | head -80
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
