#!/usr/bin/env bash
# For a later call (written in session 51, not run: the device minutes were spent), on nvidia-h200-x4: are
# two-shot grids past the caps (64 programs, 512 warps; tools/tune.py) faster, and never slow, with the first-warp
# barrier, across sizes? stall_probe at TP4 and TP2 (GPUs 0,1), 1 / 4 / 16 / 64 MB, 24 rounds, 64- against
# 128- and 256-program shapes. If the wider shapes win from some size on with no slow timing, the next step is to
# add them to TwoShot.candidates, lift the caps in tune.py (and the test that keeps the tables under them), rerun
# tune at TP2 and TP4, and bench the new tables against the packaged ones and the peers.
# Prediction: no slow timing; 128 x 2048 x 8 3-5% faster than the tables' 64-program shapes from 4 MB at TP4,
# level or slower at 1 MB; at TP2 1-3% from 16 MB.
set -uo pipefail
source scripts/gpu_env.sh
P=benchmarks/experiments/stall_probe.py
S=64x8192x8,64x4096x8,128x2048x8,128x4096x8,256x2048x4
for b in 1M 4M 16M 64M; do
  echo "== TP4 $b"; timeout 110 python3 $P --world 4 --bytes $b --rounds 24 --shapes $S --json "$OUT/tp4-$b.json" \
    2>&1 | grep -v "^round"
done
for b in 4M 16M 64M; do
  echo "== TP2 $b"; CUDA_VISIBLE_DEVICES=0,1 timeout 60 python3 $P --world 2 --bytes $b --rounds 24 --shapes $S \
    --json "$OUT/tp2-$b.json" 2>&1 | grep -v "^round"
done
