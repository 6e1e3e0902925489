#!/usr/bin/env bash
# Session 37, call 4 (2 GPUs): MoEShape.copy_engine (the routed dispatch's rows to the peers by the
# copy engine on a side stream, beside the send kernel). Its GPU tests (graph replay with new
# routing, stragglers, sentinels, bad input, a missing peer, the reference); then against the default
# (SM stores) at 512 / 2048 / 4096 tokens, both shapes, dispatch + combine in graphs, 3 rounds, and
# the dispatch alone at 4096.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "copy-engine or copy_engine" 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8"
for shape in deepseek-v3 qwen3-moe; do
  timeout 130 $M --shape $shape --tokens 512,2048,4096 --variants default,copy_engine=1 \
    --json "$OUT/ce-$shape.json" 2>&1 | tail -4 | sed "s/^/$shape: /"
done
timeout 80 $M --shape deepseek-v3 --tokens 4096 --op dispatch --variants default,copy_engine=1 \
  --json "$OUT/ce-dispatch.json" 2>&1 | tail -2 | sed "s/^/dispatch: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
