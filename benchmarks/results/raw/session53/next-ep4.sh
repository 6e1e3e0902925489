#!/usr/bin/env bash
# For a later call (written in session 53, not run: the device minutes were spent), on nvidia-h200-x4 (warm the
# Triton cache first: on a fresh machine session 53's EP4 bench of three counts did not finish in 300 s).
# (1) The paired layout at EP4 (the routed send kernel's stack frame there is the paired layout's; measured at EP2
#     only): paired_layout=0 in turn with the default, both phases, DeepSeek-V3 and Qwen3-MoE at 1024 / 4096.
# (2) bench --op moe --world 4 at 1-512 tokens with the present defaults (the EP4 file's first report covers
#     1024-4096 only; its second, tree 8da58ee, the rest).
# Prediction: (1) level within 1% (EP2: 1.2-1.9% less with it at 4096); (2) as the second report within 1.5 µs
# (nothing below 1024 tokens changed since).
set -uo pipefail
source scripts/gpu_env.sh
V="python3 benchmarks/experiments/moe_variants.py --world 4 --rounds 2 --heap-gb 8"
for s in deepseek-v3 qwen3-moe; do
  timeout 150 $V --shape $s --tokens 1024,4096 --variants default,paired_layout=0 --json "$OUT/paired-$s.json" \
    > "$OUT/paired-$s.log" 2>&1; echo "paired $s rc $?"; tail -3 "$OUT/paired-$s.log"
done
timeout 280 python3 -m tritoncomm bench --op moe --world 4 --tokens 1,8,128,256,384,512 \
  --json "$OUT/moe-ep4-small.json" > "$OUT/moe-ep4-small.log" 2>&1; echo "bench rc $?"
grep -E "both|slow" "$OUT/moe-ep4-small.log" | head -30
