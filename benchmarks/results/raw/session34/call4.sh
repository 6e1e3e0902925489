#!/usr/bin/env bash
# Session 34, call 4 (2 GPUs): is the throughput combine at 4096 tokens slower since the Lamport poll
# lost its reload (call 3's bench: DeepSeek-V3 combine 375 against call 1's 355 µs)? f9b2bb6 (_old)
# against this tree (a1823bb), dispatch + combine at 512 (latency combine) and 4096 tokens
# (throughput), alternated twice (DeepSeek-V3), once for Qwen3-MoE.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 512,4096 --variants default"
for i in 1 2; do
  for tree in old new; do
    P=$PYTHONPATH; [ $tree = old ] && P=_old:$PYTHONPATH
    PYTHONPATH=$P timeout 60 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -2 | sed "s/^/$tree ds $i: /"
    [ $i = 1 ] && PYTHONPATH=$P timeout 60 $M --shape qwen3-moe --json "$OUT/$tree-qwen.json" 2>&1 | tail -2 \
      | sed "s/^/$tree qwen: /"
  done
done
