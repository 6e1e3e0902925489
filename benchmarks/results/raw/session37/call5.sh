#!/usr/bin/env bash
# Session 37, call 5 (2 GPUs): MoEShape.copy_engine = N copies per peer, each followed by its flag,
# the peers' rows laid out per copy as its flag arrives. Its GPU tests (4 copies); then against the
# default (SM stores) at 512 / 4096 tokens, dispatch + combine in graphs, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "copy-engine or copy_engine" 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8"
timeout 150 $M --shape deepseek-v3 --tokens 512,4096 --variants default,copy_engine=1,copy_engine=4,copy_engine=16 \
  --json "$OUT/ce-deepseek-v3.json" 2>&1 | tail -3 | sed "s/^/deepseek-v3: /"
timeout 120 $M --shape qwen3-moe --tokens 512,4096 --variants default,copy_engine=4,copy_engine=16 \
  --json "$OUT/ce-qwen3-moe.json" 2>&1 | tail -3 | sed "s/^/qwen3-moe: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
