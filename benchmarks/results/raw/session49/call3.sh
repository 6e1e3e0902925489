#!/usr/bin/env bash
# Session 49, call 3 (4 GPUs asked for): the routed layout's rows, one at a time, with their first column block
# loaded before their entries and slots and each next block before the last one's stores
# (MoEShape.layout_lookahead=1) against the default. EP4 at 256-512 tokens, then EP2 at 384 / 512 / 1024
# (DeepSeek-V3 on GPUs 0,1 beside Qwen3-MoE on GPUs 2,3); 2 rounds, both phases. Then its GPU tests, worlds 2 and 4.
# Call 2's stamps: at EP4 (Qwen3-MoE, 384 tokens) the layout after the barrier took 15 / 20 µs (median / latest
# program) for 3 or 6 rows, about 3.5 µs a row, each row's loads after its slots (two column blocks, each a round).
# Prediction: 2-5 µs less at EP4 (3-6 rows, about 1 µs saved a row, less the small spills: 16-24 bytes of stack
# at EP4 offline), 0.5-1.5 at EP2 384 / 512; level at 1024 (pairs).
set -uo pipefail
source scripts/gpu_env.sh
V="benchmarks/experiments/moe_variants.py --rounds 2 --variants default,layout_lookahead=1"
for s in deepseek-v3 qwen3-moe; do
  timeout 150 python3 $V --world 4 --tokens 256,320,384,448,512 --shape $s --json "$OUT/ep4-$s.json" 2>&1 \
    | tail -6 | sed "s/^/ep4 $s: /"
done
CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 $V --world 2 --tokens 384,512,1024 --shape deepseek-v3 \
  --json "$OUT/ep2-deepseek-v3.json" > "$OUT/ep2-ds.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 timeout 150 python3 $V --world 2 --tokens 384,512,1024 --shape qwen3-moe \
  --json "$OUT/ep2-qwen3-moe.json" > "$OUT/ep2-q.log" 2>&1 &
wait
tail -4 "$OUT/ep2-ds.log" | sed "s/^/ep2 deepseek-v3: /"
tail -4 "$OUT/ep2-q.log" | sed "s/^/ep2 qwen3-moe: /"
for w in 2 4; do
  TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=$w timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/collectives/test_moe.py -k "ahead" 2>&1 | tail -2 | sed "s/^/tests world $w: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
