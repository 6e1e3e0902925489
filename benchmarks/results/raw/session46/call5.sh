#!/usr/bin/env bash
# Session 46, call 5 (2 GPUs): the MoE and EP-layer GPU tests at world 2 on the tree with the paired layout (call 4's
# run stopped at its 240 s limit, 70% through, nothing failed by then); then the routed packets (layout as rows
# arrive, MoEShape.routed_packets) against the default at mid counts.
# Prediction (written before the call): the tests pass. Routed packets: lose on H100 as before (raw/session35/call1);
# on H200, with 1.4x the HBM bandwidth for the packets' polls and resets, within 2 µs of the default at 384 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 330 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,routed_packets=1"
timeout 90 $M --shape deepseek-v3 --tokens 384,1024 --json "$OUT/ds.json" 2>&1 | tail -3 | sed "s/^/ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
