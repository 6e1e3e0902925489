#!/usr/bin/env bash
# Session 50, call 1 (2 GPUs, nvidia-h200-x2; the 4-GPU kind not lent): where the routed dispatch's time goes at
# EP2 and two cheap changes against it.
# (1) Stage stamps at 384 tokens per rank (moe_trace.py), Qwen3-MoE and DeepSeek-V3, with the layout's first item
#     stamped inside (route.ROUTED_STAGES 7-10).
#     Prediction: the item's slots stored about 1.5 µs after its start (ids, then the slots' loads), its first
#     block stored about 1 µs later, its last stores issued 1 µs after that (Qwen: 2 blocks of 2048).
# (2) moe_variants, both phases, 2 rounds, in turn with the default:
#     layout_block_h (the layout of the peers' rows in one step per row: 4096 Qwen3-MoE, 8192 DeepSeek-V3;
#     default: the send's 2048 / 4096) and super_blocks 8 / 4 (default 16: the route kernel's superblock tasks
#     count 1024 entries each and end last, 2.1 µs against 0.6 for the block tasks in session 49's stamps, and the
#     send kernel starts only after them).
#     Prediction: layout_block_h 0.5-1.5 µs less at 256-1024 tokens; super_blocks=8 about 1 µs less at 384-1024,
#     super_blocks=4 as much or a little less at 256-384, more at 1024 (32 superblock rows: two loads per row).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T=benchmarks/experiments/moe_trace.py
for s in qwen3-moe deepseek-v3; do
  timeout 120 python3 $T --world 2 --tokens 384 --shape $s --json "$OUT/trace-$s.json" > "$OUT/trace-$s.log" 2>&1
done
timeout 120 python3 $T --world 2 --tokens 384 --shape qwen3-moe --set super_blocks=8,layout_block_h=4096 \
  --json "$OUT/trace-qwen3-moe-sb8-lb4096.json" > "$OUT/trace-qwen3-moe-sb8-lb4096.log" 2>&1
V="benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --tokens 256,384,1024"
timeout 210 python3 $V --shape qwen3-moe --variants default,layout_block_h=4096,super_blocks=8,super_blocks=4 \
  --json "$OUT/var-qwen3-moe.json" > "$OUT/var-qwen3-moe.log" 2>&1
timeout 210 python3 $V --shape deepseek-v3 --variants default,layout_block_h=8192,super_blocks=8,super_blocks=4 \
  --json "$OUT/var-deepseek-v3.json" > "$OUT/var-deepseek-v3.log" 2>&1
for f in trace-qwen3-moe trace-deepseek-v3 trace-qwen3-moe-sb8-lb4096; do
  echo "== $f"; grep -A 15 "rank 0:" "$OUT/$f.log" || tail -5 "$OUT/$f.log"; done
for f in var-qwen3-moe var-deepseek-v3; do echo "== $f"; tail -5 "$OUT/$f.log"; done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
