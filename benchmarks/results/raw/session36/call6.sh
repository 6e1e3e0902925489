#!/usr/bin/env bash
# Session 36, call 6 (2 GPUs): the prefill shape's one_kernel_entries = 2048 (PREFILL_ONE_KERNEL_ENTRIES):
# the MoE and EP GPU tests (the 160-token default-shape instance now dispatches in one kernel); the new
# default against one_kernel_entries=1024 at 192 / 256 tokens, and bounded calls of 256 tokens on
# 4096-token instances. Dispatch + combine in graphs, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for shape in deepseek-v3 qwen3-moe; do
  timeout 60 $M --shape $shape --tokens 192,256 --variants default,one_kernel_entries=1024 \
    --json "$OUT/ok-$shape.json" 2>&1 | tail -2 | sed "s/^/$shape: /"
  timeout 60 $M --shape $shape --tokens 256 --max-tokens 4096 --heap-gb 8 \
    --variants bound,bound+one_kernel_entries=1024 --json "$OUT/okb-$shape.json" 2>&1 | tail -1 | sed "s/^/$shape bound: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
