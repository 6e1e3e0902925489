#!/usr/bin/env bash
# Session 35, call 4 (2 GPUs), tree 33a699a (the role split on by default: half the one-kernel
# dispatch's programs send; half the latency combine's push while tokens_bound * hidden <= 65536):
# the new default against the old one (send_programs=0+push_programs=0) at 1-64 tokens, and at 128
# (264 programs) against push_programs=132 too; the MoE and EP GPU tests; bench --op moe.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for shape in deepseek-v3 qwen3-moe; do
  timeout 80 $M --shape $shape --tokens 1,8,16,32,64 --variants default,send_programs=0+push_programs=0 \
    --json "$OUT/v-$shape.json" 2>&1 | tail -6 | sed "s/^/$shape: /"
  timeout 60 $M --shape $shape --tokens 128 --variants default,push_programs=132,send_programs=0+push_programs=0 \
    --json "$OUT/w-$shape.json" 2>&1 | tail -2 | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf variants.tgz *.json && rm *.json)
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -8
timeout 240 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-h100-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -42
