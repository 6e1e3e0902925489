#!/usr/bin/env bash
# Session 38, call 1 (2 GPUs): the routed send kernel split into roles (MoEShape.routed_senders:
# senders publish runs of their items, the other programs lay out the peers' rows run by run, no send
# barrier). Its GPU tests (graph replay, stragglers, the CPU-world cases on GPUs), then dispatch +
# combine in graphs at 512 / 4096 tokens, both shapes, against the default (every program sends, then
# lays out after the barrier), 3 rounds; and the dispatch alone at 4096 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "routed-split or routed_roles" 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8"
V=default,routed_senders=-1,routed_senders=-1+routed_runs=2,routed_senders=-1+routed_runs=32,routed_senders=176
for shape in deepseek-v3 qwen3-moe; do
  timeout 170 $M --shape $shape --tokens 512,4096 --variants $V --json "$OUT/split-$shape.json" 2>&1 \
    | tail -4 | sed "s/^/$shape: /"
done
timeout 90 $M --shape deepseek-v3 --tokens 4096 --op dispatch --variants default,routed_senders=-1 \
  --json "$OUT/dispatch.json" 2>&1 | tail -3 | sed "s/^/dispatch: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
