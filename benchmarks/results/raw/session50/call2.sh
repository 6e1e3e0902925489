#!/usr/bin/env bash
# Session 50, call 2 (2 GPUs): MoEShape.early_routing (each send program computes its layout's first two rows'
# entries and slots, every source's count and the first source's offsets between arriving at its barrier slot and
# waiting there, after a slot of the routing's own), against the default.
# Call 1's stamps (Qwen3-MoE, 384 tokens, per program in SM cycles): barrier passed -> first item started 2.27 µs
# median (the counts, then this rank's superblock rows), -> its slots stored 1.17 (ids, then the slots' loads),
# -> its first block stored 0.81, -> its stores issued 0.61; barrier -> laid out 6.31 median, 9.64 the latest.
# Prediction: the first two of those stages move before the barrier: barrier -> laid out about 3 µs less
# (median and latest), both phases 2-3 µs less at 256-1024 tokens (Qwen3-MoE 46.1 -> about 43.5 at 384,
# DeepSeek-V3 67.6 -> about 65); still above (c) (36.2, 54.4).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel_dispatch or wider_than" 2>&1 | tail -3
T=benchmarks/experiments/moe_trace.py
for s in qwen3-moe deepseek-v3; do
  timeout 100 python3 $T --world 2 --tokens 384 --shape $s --set early_routing=1 --json "$OUT/trace-$s-early.json" \
    > "$OUT/trace-$s-early.log" 2>&1
done
V="benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --tokens 256,384,512,1024"
for s in qwen3-moe deepseek-v3; do
  timeout 200 python3 $V --shape $s --variants default,early_routing=1 --json "$OUT/var-$s.json" > "$OUT/var-$s.log" 2>&1
done
for s in qwen3-moe deepseek-v3; do echo "== trace $s early"; grep -A 15 "rank 0:" "$OUT/trace-$s-early.log" \
  || tail -5 "$OUT/trace-$s-early.log"; done
for s in qwen3-moe deepseek-v3; do echo "== var $s"; tail -5 "$OUT/var-$s.log"; done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
