#!/usr/bin/env bash
# Session 54 call 4 (nvidia-h200-x4, warm after call 3): raw/session51/next-barrier-caps.sh's TP2 part (GPUs 0,1)
# at 1 / 4 / 16 / 64 MB and TP4 at 1 MB, 16 rounds. Prediction (session 51): at TP2 1-3% from 16 MB.
source scripts/gpu_env.sh; P=benchmarks/experiments/stall_probe.py; S=64x8192x8,64x4096x8,128x2048x8,128x4096x8,256x2048x4; for b in 1M 4M 16M 64M; do echo "== TP2 $b"; CUDA_VISIBLE_DEVICES=0,1 timeout 60 python3 $P --world 2 --bytes $b --rounds 16 --shapes $S --json "$OUT/tp2-$b.json" 2>&1 | grep -v "^round" | grep -v eager; done; echo "== TP4 1M"; timeout 60 python3 $P --world 4 --bytes 1M --rounds 16 --shapes $S --json "$OUT/tp4-1M.json" 2>&1 | grep -v "^round" | grep -v eager
