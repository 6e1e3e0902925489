#!/usr/bin/env bash
# Session 38, call 2 (2 GPUs): call 1 again without the tests: its variant of 176 senders had failed (the
# role field was applied to the decode shape of 132 programs). The routed send kernel split into roles.
# Dispatch + combine in graphs at 512 / 4096 tokens, both shapes, against the default, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8"
V=default,routed_senders=-1,routed_senders=-1+routed_runs=2,routed_senders=-1+routed_runs=32,routed_senders=176
for shape in deepseek-v3 qwen3-moe; do
  timeout 170 $M --shape $shape --tokens 512,4096 --variants $V --json "$OUT/split-$shape.json" 2>&1 \
    | tail -4 | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
