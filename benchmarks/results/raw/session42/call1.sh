#!/usr/bin/env bash
# Session 42, call 1 (2 GPUs): the one-kernel dispatch loading one column block ahead (MoEShape.lookahead) against
# the default, both phases in turn, 3 rounds; then the default flipped to lookahead in this checkout: the MoE GPU
# tests at world 2 and bench --op moe at 128 and 256 tokens (every row checked, the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,lookahead=1
timeout 150 $M --rounds 3 --shape deepseek-v3 --tokens 8,64,128,256 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -5 | sed "s/^/ds: /"
timeout 120 $M --rounds 3 --shape qwen3-moe --tokens 64,128,256 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -4 | sed "s/^/q: /"
timeout 90 $M --rounds 3 --shape deepseek-v3 --fp8 --tokens 128 --variants $V --json "$OUT/ds-fp8.json" 2>&1 \
  | tail -2 | sed "s/^/ds fp8: /"
sed -i 's/    lookahead: bool = False/    lookahead: bool = True/' tritoncomm/collectives/moe/__init__.py
grep -n "lookahead: bool" tritoncomm/collectives/moe/__init__.py
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "graph or straggl or sentinel or split or senders or apart" 2>&1 | tail -4
timeout 120 python3 -m tritoncomm bench --op moe --world 2 --tokens 128,256 --json "$OUT/moe-ep2-lookahead.json" 2>&1 \
  | tee "$OUT/moe.log" | tail -16
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
