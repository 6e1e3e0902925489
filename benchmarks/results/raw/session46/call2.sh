#!/usr/bin/env bash
# Session 46, call 2 (2 GPUs): the layout of the peers' rows two at a time (MoEShape.paired_layout, on) against one
# at a time (paired_layout=0, the tree before), in turn, 2 rounds, both phases; then the stage stamps at Qwen3-MoE's
# 384 / 512 tokens with pairs.
# Prediction (written before the call): the 120 programs with two of 384 rows laid them out in about 9.4 µs after
# the barrier, the others one row in about 4.1 (raw/session45/call10): three rounds of loads per row. Two rows in
# one set of rounds should take about 6, so the dispatch's last program ends about 3 µs earlier: Qwen3-MoE at 384
# 46.8 -> about 44.5, at 512 (almost every program has two rows) 56.3 -> about 54; DeepSeek-V3 at 384 68.4 -> about
# 66; at 4096 (15-16 rows per program) 0-2% faster.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,paired_layout=0"
timeout 110 $M --shape qwen3-moe --tokens 384,512,4096 --json "$OUT/q.json" 2>&1 | tail -4 | sed "s/^/q: /"
timeout 110 $M --shape deepseek-v3 --tokens 384,512,4096 --json "$OUT/ds.json" 2>&1 | tail -4 | sed "s/^/ds: /"
timeout 110 python3 benchmarks/experiments/moe_trace.py --world 2 --shape qwen3-moe --tokens 384,512 \
  --json "$OUT/q-trace.json" 2>&1 | tee "$OUT/trace.log" | tail -24
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
