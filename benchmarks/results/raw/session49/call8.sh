#!/usr/bin/env bash
# Session 49, call 8 (one H200: the 4-GPU kind was withdrawn): the stalls against the dispatch's write into host
# memory, at EP1. Main 851f46e (in alt_tree/: every dispatch's program 0 stores its two counters into host-mapped
# words) against the tree with the copy made only where they changed; ours alone at 384 tokens (Qwen3-MoE) and 512
# (DeepSeek-V3), 6 rounds of 20 samples, each tree in turn.
# Prediction: unknown whether EP1 stalls at all; if the old tree stalls here, the new one does not.
set -uo pipefail
source scripts/gpu_env.sh
mkdir -p alt_tree && git archive 851f46e tritoncomm | tar -x -C alt_tree
for pass in 1; do
  for tree in old new; do
    P=$PWD; [ $tree = old ] && P=$PWD/alt_tree
    for s in "qwen3-moe 384" "deepseek-v3 512"; do
      set -- $s
      echo "== pass $pass, $tree tree, $1 $2"
      PYTHONPATH=$P:$PWD timeout 100 python3 benchmarks/experiments/moe_stalls.py --world 1 --shape $1 --tokens $2 \
        --rounds 6 --cases ours --json "$OUT/$tree-$1-$pass.json" 2>&1 | tail -1
    done
  done
done
rm -rf alt_tree
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
