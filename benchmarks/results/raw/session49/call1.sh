#!/usr/bin/env bash
# Session 49, call 1 (4 GPUs asked for, branch next/dealt-layout rebased on main 851f46e): the routed layout dealt
# over every program (MoEShape.dealt_layout=1) against the paired one (default), where a source's rows do not split
# evenly over the send kernel's 264 programs. EP4 at 320 / 384 / 448 tokens, then EP2 at 256-512 (DeepSeek-V3 on
# GPUs 0,1 and Qwen3-MoE on GPUs 2,3 at the same time: disjoint NVLink pairs). 2 rounds, both phases.
# Prediction (written 2026-11-28, session 48): 1-3 µs less at 320-448 tokens at EP2, 2-6 at EP4; level at 256 and
# within 1 µs at 512.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2 --variants default,dealt_layout=1"
for s in deepseek-v3 qwen3-moe; do
  timeout 150 python3 $V --world 4 --tokens 320,384,448 --shape $s --json "$OUT/ep4-$s.json" 2>&1 \
    | tail -4 | sed "s/^/ep4 $s: /"
done
CUDA_VISIBLE_DEVICES=0,1 timeout 170 python3 $V --world 2 --tokens 256,320,384,448,512 --shape deepseek-v3 \
  --json "$OUT/ep2-deepseek-v3.json" > "$OUT/ep2-ds.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 timeout 170 python3 $V --world 2 --tokens 256,320,384,448,512 \
  --shape qwen3-moe --json "$OUT/ep2-qwen3-moe.json" > "$OUT/ep2-q.log" 2>&1 &
wait
tail -6 "$OUT/ep2-ds.log" | sed "s/^/ep2 deepseek-v3: /"
tail -6 "$OUT/ep2-q.log" | sed "s/^/ep2 qwen3-moe: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
