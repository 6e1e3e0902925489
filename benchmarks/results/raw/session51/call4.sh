#!/usr/bin/env bash
# Session 51, call 4 (nvidia-h200-x2): the EP2 bench on the present tree (first-warp barrier; docs/moe.md's EP2 H200
# table is session 46's, tree 73a2bec + 9d57465), every default count, both shapes, every row checked; its latency
# and throughput columns also answer whether the combine's EP2 switch (THROUGHPUT_FROM_ELEMS_EP2) holds on H200s.
# Then the MoE GPU tests at world 2 for what time is left.
# Prediction: both phases within 1.2 µs of the session-46 table (0.1-1.1 µs lower at 384 in session 50); the bold
# cells stay bold (DeepSeek-V3 128-512, Qwen3-MoE 256-1024), none of ours slow; the auto mode within 1% of the
# faster of the two forced modes at every count.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 400 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-h200-ep2.json" > "$OUT/moe.log" 2>&1
echo "bench rc=$?"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
grep -E " both |slow|MoE" "$OUT/moe.log"
