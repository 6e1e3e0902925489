#!/usr/bin/env bash
# Session 40, call 3 (4 GPUs), tree c7557e3: MoEShape.direct_from at EP4. Its GPU tests at world 4; both phases
# at 512 / 4096 tokens, 2 rounds, in turn: default, route_barrier=1, direct_from=0; the dispatch alone at 4096.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvidia-smi topo -m | head -6
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "direct or two_kernel_dispatch" 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 4 --heap-gb 10 --rounds 2"
V=default,route_barrier=1,direct_from=0
for shape in deepseek-v3 qwen3-moe; do
  timeout 150 $M --tokens 512,4096 --shape $shape --variants $V --json "$OUT/$shape.json" 2>&1 | tail -3 \
    | sed "s/^/$shape: /"
  timeout 90 $M --tokens 4096 --op dispatch --shape $shape --variants $V --json "$OUT/$shape-dispatch.json" 2>&1 \
    | tail -2 | sed "s/^/$shape dispatch: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
