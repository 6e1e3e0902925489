#!/usr/bin/env bash
# Session 54 call 7 (nvidia-h200-x4; ../shared/peers carried as .peers): the fused all-reduce + add + RMSNorm at
# TP4 on H200s. fused-h200-tp4.json (2026-11-22) predates the Lamport variant and FlashInfer's fused op; the
# TP4 selection (LL to 16 KB, Lamport to 512 KB, two-shot above) was measured on four H100s only.
# layers --parts norm --world 4: every variant per shape, FlashInfer's fused op and NCCL + torch in the same run.
# Prediction: the H100 selection's picks within 3% of the fastest variant at every shape; ours at or below
# FlashInfer's fused op from 8 tokens on, within 0.2 µs of it at 1 token.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 400 python3 -m tritoncomm layers --parts norm --world 4 --json "$OUT/layers-tp4-{part}.json" \
  > "$OUT/layers-tp4.log" 2>&1; echo "layers rc $?"
grep -v -i "warning\|enable_symm" "$OUT/layers-tp4.log" | tail -30
