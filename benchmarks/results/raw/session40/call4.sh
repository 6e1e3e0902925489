#!/usr/bin/env bash
# Session 40, call 4 (2 GPUs): the routed stage stamps at 4096 tokens per rank, both shapes, with direct rows
# (MoEShape.direct_from=0) and without (the default), to see which stage the direct rows change.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
for shape in qwen3-moe deepseek-v3; do
  for d in 0 2147483648; do
    timeout 100 python3 benchmarks/experiments/moe_trace.py --world 2 --shape $shape --tokens 4096 --heap-gb 8 \
      --direct-from $d --json "$OUT/trace-$shape-$d.json" > "$OUT/trace-$shape-$d.log" 2>&1
    grep -m1 "rank 0" "$OUT/trace-$shape-$d.log"; sed -n '/rank 0/,/rank 1/p' "$OUT/trace-$shape-$d.log" | grep -v "rank 1" \
      | grep -E "sent|barrier|laid|combine.*(started|pushed|done)"
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
