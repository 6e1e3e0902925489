#!/usr/bin/env bash
# Session 34, call 3 (2 GPUs): the latency combine's first look at the next rank's row issued before
# this rank's part is summed (this tree) against a1823bb (_base), dispatch + combine at 1 / 8 / 128
# tokens, alternated (DeepSeek-V3 twice, Qwen3-MoE once); this tree's MoE and EP GPU tests; then
# bench --op moe on whichever tree was faster in DeepSeek-V3's sum over both rounds (bench-tree.txt).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default"
for i in 1 2; do
  for tree in base new; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
    PYTHONPATH=$P timeout 45 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
    [ $i = 1 ] && PYTHONPATH=$P timeout 45 $M --shape qwen3-moe --json "$OUT/$tree-qwen.json" 2>&1 | tail -3 \
      | sed "s/^/$tree qwen: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 170 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
WIN=$(python3 - "$OUT" <<'PY'
import json, statistics, sys
def total(tree):
    return sum(statistics.median(v["default"]) for i in (1, 2)
               for v in json.load(open(f"{sys.argv[1]}/{tree}-ds-{i}.json"))["times_us"].values())
print("new" if total("new") < total("base") else "base")
PY
)
echo "bench on: $WIN" | tee "$OUT/bench-tree.txt"
OUT=$(cd "$OUT" && pwd)
(cd "$OUT" && tar czf ab.tgz base-*.json new-*.json && rm base-*.json new-*.json)  # few files come back
D=.; [ "$WIN" = base ] && D=_base  # python -m puts the working directory first on the path
(cd $D && PYTHONPATH=. timeout 200 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-h100-ep2.json" \
  2>&1 | tee "$OUT/moe.log" | tail -42)
