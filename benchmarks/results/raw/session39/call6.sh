#!/usr/bin/env bash
# Session 39, call 6 (2 GPUs), the tree of calls 3 and 5: stage stamps at 2048 / 4096 tokens per rank, both
# shapes (the routed dispatch; the throughput combine: pushed + barrier passed, then done): how long the
# combine's pushes take against its sum after the barrier.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
for shape in deepseek-v3 qwen3-moe; do
  timeout 100 python3 benchmarks/experiments/moe_trace.py --world 2 --shape $shape --tokens 2048,4096 --heap-gb 8 \
    --json "$OUT/trace-$shape.json" 2>&1 | tee "$OUT/trace-$shape.log" | tail -24
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
