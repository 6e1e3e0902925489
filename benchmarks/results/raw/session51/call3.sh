#!/usr/bin/env bash
# Session 51, call 3 (nvidia-h200-x4): early_routing (commit c0660f1's form, restored by reverting f7abcf6 in the
# working tree) at EP4. Call 2's stamps (Qwen3-MoE 384, EP4) put the layout's first item 4.1 µs after the barrier
# (median; 2.3 at EP2), the layout after the barrier 15.5 µs (latest 25.2): with three peers' counts and
# superblocks to load, the prologue that early_routing moves before the arrival is twice EP2's.
# Prediction: early_routing 2-4 µs less at EP4 for Qwen3-MoE 256-512 and DeepSeek-V3 256-384 (EP2: 0.6-1.0 for
# Qwen3-MoE, level for DeepSeek-V3). Then 36 more rounds of the TP4 stall probe (first warp).
set -uo pipefail
source scripts/gpu_env.sh
V="benchmarks/experiments/moe_variants.py --world 4 --rounds 2"
timeout 200 python3 $V --shape qwen3-moe --tokens 256,384,512 --variants default,early_routing=1 \
  --json "$OUT/var-q.json" > "$OUT/var-q.log" 2>&1
timeout 170 python3 $V --shape deepseek-v3 --tokens 256,384 --variants default,early_routing=1 \
  --json "$OUT/var-ds.json" > "$OUT/var-ds.log" 2>&1
timeout 90 python3 benchmarks/experiments/moe_trace.py --world 4 --tokens 384 --shape qwen3-moe \
  --set early_routing=1 --json "$OUT/trace-q-early.json" > "$OUT/trace-q-early.log" 2>&1
timeout 100 python3 benchmarks/experiments/stall_probe.py --world 4 --bytes 16M --rounds 36 \
  --json "$OUT/probe36.json" > "$OUT/probe36.log" 2>&1
for f in var-q var-ds; do echo "== $f"; tail -5 "$OUT/$f.log"; done
echo "== trace"; grep -A 14 "rank 0:" "$OUT/trace-q-early.log" || tail -5 "$OUT/trace-q-early.log"
echo "== probe"; tail -9 "$OUT/probe36.log"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
