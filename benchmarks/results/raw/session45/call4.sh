#!/usr/bin/env bash
# Session 45, call 4 (2 GPUs): the latency combine's sums in the reverse order of its pushes (program pid sums
# program grid - 1 - pid's items) against the tree before it (old_tree/: git archive of b8543f6's tritoncomm),
# alternating, 2 rounds each, both phases. Qwen3-MoE at 128-512 tokens (all in the latency mode), also with
# super_blocks=8 (the route kernel's superblock tasks half as long); DeepSeek-V3 at 128 and 384 by default and
# with the latency mode forced (384 takes the throughput mode by default).
# Prediction (written before the call): Qwen3-MoE 384 51.5 -> about 48, 512 and 128-256 within 0.5; DeepSeek-V3
# 384 in the latency mode 74.6 -> about 71 (then ahead of the throughput mode's 74.3), 128 within 0.5.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 1"
for rep in 1 2; do
  for tree in old new; do
    P=.; [ $tree = old ] && P=$PWD/old_tree
    PYTHONPATH=$P timeout 90 $M --shape qwen3-moe --tokens 128,256,384,512 --variants default,super_blocks=8 \
      --json "$OUT/q-$tree-$rep.json" 2>&1 | tail -5 | sed "s/^/q $tree $rep: /"
    PYTHONPATH=$P timeout 80 $M --shape deepseek-v3 --tokens 128,384 --variants default,mode=latency \
      --json "$OUT/ds-$tree-$rep.json" 2>&1 | tail -3 | sed "s/^/ds $tree $rep: /"
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
