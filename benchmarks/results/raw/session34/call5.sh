#!/usr/bin/env bash
# Session 34, call 5 (2 GPUs): the throughput combine's 4096-token loss of call 4. Three trees,
# dispatch + combine at 8 / 512 / 4096 tokens (DeepSeek-V3), alternated twice: base a1823bb (_base);
# reload = base with the combine's poll as before e557e00 (a reload after the count; _reload); split
# = base with the combine's last stage in one loop per mode (this tree).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 8,512,4096 --variants default"
for i in 1 2; do
  for tree in base reload split; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH; [ $tree = reload ] && P=_reload:$PYTHONPATH
    PYTHONPATH=$P timeout 60 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
  done
done
