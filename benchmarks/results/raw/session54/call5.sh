#!/usr/bin/env bash
# Session 54 call 5 (nvidia-h200-x4; ../shared/peers carried as .peers).
# The packaged table's TP4 all-reduce rows were tuned on four H100s (2026-11-26) and never timed on H200s, and the
# H200 TP4 all-reduce bench (2026-11-22) predates them and the peers. With the caps lifted to 128 programs and
# 1024 warps (calls 3-4: no slow timing in 16 rounds per size and shape; 128 x 4096 x 8 311.0 against 322.0 µs
# for the table's 64 x 4096 x 8 at 64 MB TP4), the two-shot gains 128-program candidates from 16 MB.
# (1) tune --op allreduce --world 4 (bf16), merged into a copy of the packaged H200 table.
# (2) bench --op allreduce --world 4 with that table, graph mode, with the peers (FlashInfer's TRT-LLM and vLLM
#     custom all-reduce) and NCCL in the same run.
# Prediction: the tune keeps the Lamport rows up to 16 MB within 5% of the H100 tune's picks; 128-program two-shot
# wins at 32-128 MB by 2-4%; the bench: ours at or below the faster peer from 2 KB to 16 MB at TP4.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c "import tritoncomm.tools.peers as p; print('peers missing:', p.flashinfer_missing())"
cp tritoncomm/collectives/tables/nvidia-h200.json "$OUT/nvidia-h200.json"
timeout 280 python3 -m tritoncomm tune --op allreduce --world 4 --out "$OUT/nvidia-h200.json" > "$OUT/tune-tp4.log" 2>&1
echo "tune rc $?"; grep -E "^ +allreduce" "$OUT/tune-tp4.log" | tail -20
timeout 280 python3 -m tritoncomm bench --op allreduce --world 4 --modes graph --table "$OUT/nvidia-h200.json" \
  --json "$OUT/bench-tp4.json" > "$OUT/bench-tp4.log" 2>&1
echo "bench rc $?"; tail -30 "$OUT/bench-tp4.log"
