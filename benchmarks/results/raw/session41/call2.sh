#!/usr/bin/env bash
# Session 41, call 2 (2 GPUs): MoEShape.throughput_block_h (the throughput combine's columns per step; the
# prefill shape's default now 4096). GPU tests at world 2 (graph replay, stragglers: prefill-shaped instances in
# the throughput mode, the auto switch, rows over programs); then both phases in turn: default (4096),
# throughput_block_h=2048 (the columns before), 8192.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "cuda_graph or stragglers or auto_mode or rows_split" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 16"
V=default,throughput_block_h=2048,throughput_block_h=8192
timeout 170 $M --rounds 3 --shape deepseek-v3 --tokens 128,512,2048,4096 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -5 | sed "s/^/ds: /"
timeout 120 $M --rounds 3 --shape qwen3-moe --tokens 512,2048,4096 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -4 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
