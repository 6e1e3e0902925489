#!/usr/bin/env bash
# For a later call (written in session 54, not run: nvidia-h200-x8 was never lent), on nvidia-h200-x8 with
# ../shared/peers carried as .peers. The packaged TP8 rows (2026-11-22) predate the Lamport algorithms and the
# raised barrier caps, and the TP8 bench has no peer columns.
# (1) tune --op allreduce --world 8, merged into a copy of the packaged table; (2) bench --op allreduce --world 8
# with it, the peers and NCCL. Then copy the TP8 rows into tritoncomm/collectives/tables/nvidia-h200.json (as
# session 54 did for TP2/TP4), the bench report into benchmarks/results/allreduce-h200-tp8.json, and rerun
# benchmarks/render_docs.py.
# Prediction: Lamport one-shot to 64 KB, its two-shot to 16 MB, barrier two-shot above; geomean over NCCL above the
# 2.03x of 2026-11-22; at or below the faster peer from 256 KB.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c "import tritoncomm.tools.peers as p; print('peers missing:', p.flashinfer_missing())"
cp tritoncomm/collectives/tables/nvidia-h200.json "$OUT/nvidia-h200.json"
timeout 300 python3 -m tritoncomm tune --op allreduce --world 8 --out "$OUT/nvidia-h200.json" > "$OUT/tune-tp8.log" 2>&1
echo "tune rc $?"; grep -E "^ +allreduce" "$OUT/tune-tp8.log" | tail -20
timeout 260 python3 -m tritoncomm bench --op allreduce --world 8 --modes graph --table "$OUT/nvidia-h200.json" \
  --json "$OUT/bench-tp8.json" > "$OUT/bench-tp8.log" 2>&1
echo "bench rc $?"; grep -v -i "warning\|enable_symm" "$OUT/bench-tp8.log" | tail -24
