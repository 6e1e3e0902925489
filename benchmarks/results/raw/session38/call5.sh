#!/usr/bin/env bash
# Session 38, call 5 (4 GPUs): at EP4 the link phase of the routed dispatch is longer than at EP2 (a
# token goes to about 2.7 peers), so laying out the peers' rows while they cross the links may pay
# there: the routed send kernel split into roles (routed_senders=-1) against the default, both on this
# tree (with each item's first block loaded early), and the tree before (19c1e6b, base_tree/), both
# shapes at 512 / 4096 tokens per rank, dispatch + combine in graphs, 2 rounds. First the split's
# tests at world 4 on GPUs.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "routed-split or routed_roles" 2>&1 | tee "$OUT/gpu-tests-w4.log" | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 4 --heap-gb 8 --rounds 2"
for shape in deepseek-v3 qwen3-moe; do
  (cd base_tree && timeout 100 $M --shape $shape --tokens 512,4096 --variants default \
    --json "$OUT/base-$shape.json" 2>&1 | tail -3 | sed "s/^/base $shape: /")
  timeout 130 $M --shape $shape --tokens 512,4096 --variants default,routed_senders=-1 \
    --json "$OUT/new-$shape.json" 2>&1 | tail -3 | sed "s/^/new $shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
