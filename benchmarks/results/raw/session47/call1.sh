#!/usr/bin/env bash
# Session 47, call 1 (4 GPUs asked for): branch next/layout-loads (8371df0: the layout's first round also loads
# this rank's own superblock rows and the first item's ids; every later item's ids one item ahead) against main
# (b88ac2b), at EP2 on GPUs 0,1, alternating, 2 rounds each, both phases, 256 / 384 / 512 / 1024 / 4096 tokens.
# Meanwhile on GPUs 2,3: the branch's MoE and EP-layer GPU tests at world 2.
# Prediction (written before the call): the branch takes 1-2 µs off at 256-1024 tokens for both shapes (two
# dependent rounds of loads, about 0.7 µs each, off every program's first row; the one-ahead ids hide a round per
# later row); at 4096 tokens 0-4 µs off. The tests pass.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvidia-smi topo -m | head -5
(CUDA_VISIBLE_DEVICES=2,3 PYTHONPATH=$PWD/alt_tree TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 420 \
   python3 -m pytest -q -p no:cacheprovider tests/collectives/test_moe.py tests/integrations/test_ep.py \
   > "$OUT/branch-tests.log" 2>&1; echo "tests rc $?" >> "$OUT/branch-tests.log") &
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 1 --tokens 256,384,512,1024,4096 --variants default"
for s in qwen3-moe deepseek-v3; do
  for rep in 1 2; do
    for tree in main branch; do
      P=.; [ $tree = branch ] && P=$PWD/alt_tree
      CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$P timeout 90 $M --shape $s --json "$OUT/$s-$tree-$rep.json" 2>&1 | tail -6 \
        | sed "s/^/$s $tree $rep: /"
    done
  done
done
wait
tail -4 "$OUT/branch-tests.log"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
