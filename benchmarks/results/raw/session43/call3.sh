#!/usr/bin/env bash
# Session 43, call 3 (asked for nvidia-h200-x2, no needs_h200): on H200s, bench --op moe at EP2 (the MoE issue's
# targets are set on H200s; every row checked, the baselines in the same run); on any other GPUs, the GPU tests
# and the demo at world 2 (scripts/gpu_check.sh) on the tree of the session's end.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
if nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200; then
  timeout 560 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-h200-ep2.json" 2>&1 | tee "$OUT/moe.log" \
    | grep -E " both |MoE"
else
  WORLDS=2 TEST_TIMEOUT=420 timeout 560 bash scripts/gpu_check.sh
fi
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json 2>/dev/null && rm -f *.json)
