#!/usr/bin/env bash
# Session 54 call 3 (nvidia-h200-x4, fresh machine).
# (1) raw/session53/next-ep4.sh's first part: the paired layout at EP4 (the routed send kernel's stack frame there is
#     the paired layout's; measured at EP2 only): paired_layout=0 in turn with the default, both phases,
#     DeepSeek-V3 and Qwen3-MoE at 1024 / 4096 tokens per rank, 2 rounds.
#     Prediction: level within 1% (EP2: 1.2-1.9% less with it at 4096).
# (2) raw/session51/next-barrier-caps.sh at TP4, 4 / 16 / 64 MB, 16 rounds (24 there): two-shot grids past the
#     caps (64 programs, 512 warps) with the first-warp barrier. Prediction: no slow timing; 128x2048x8 3-5% faster
#     than the 64-program shapes from 4 MB.
# The EP4 bench below 1024 tokens (next-ep4.sh's second part) is left: nothing below 1024 tokens changed since
# the EP4 file's second report.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="python3 benchmarks/experiments/moe_variants.py --world 4 --rounds 2 --heap-gb 8"
for s in deepseek-v3 qwen3-moe; do
  timeout 170 $V --shape $s --tokens 1024,4096 --variants default,paired_layout=0 --json "$OUT/paired-$s.json" \
    > "$OUT/paired-$s.log" 2>&1; echo "paired $s rc $?"; tail -3 "$OUT/paired-$s.log"
done
P=benchmarks/experiments/stall_probe.py
S=64x8192x8,64x4096x8,128x2048x8,128x4096x8,256x2048x4
for b in 4M 16M 64M; do
  echo "== TP4 $b"; timeout 75 python3 $P --world 4 --bytes $b --rounds 16 --shapes $S --json "$OUT/tp4-$b.json" \
    2>&1 | grep -v "^round"
done
