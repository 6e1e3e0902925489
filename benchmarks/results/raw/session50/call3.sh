#!/usr/bin/env bash
# Session 50, call 3 (2 GPUs): MoEShape.early_routing reordered. In call 2 the programs arrived at their slot, then
# computed the layout's first rows' slots, then waited: "barrier passed" moved 3.0 µs later (median 17.0 -> 20.0,
# Qwen3-MoE 384) and the layout after it 2.9 µs shorter, both phases level (45.9 -> 45.8). So the 5.9 µs between
# "rows sent" and "barrier passed" are spent in the arrival itself (its release waits for the program's NVLink
# stores to drain), not in waiting for the peer. Now the slots are computed after the sends and before the
# arrival, while the stores drain.
# Prediction: "barrier passed" back near 17 µs, the layout after it about 3 µs shorter: both phases 2-3 µs less
# at 256-1024 tokens (Qwen3-MoE 384 about 43.5, DeepSeek-V3 about 65).
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
