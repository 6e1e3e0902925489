#!/usr/bin/env bash
# Session 54 call 6 (nvidia-h200-x4, warm after call 5, GPUs 0-1; ../shared/peers carried as .peers): the same
# at TP2: tune --op allreduce --world 2 merged into a copy of the packaged H200 table, then bench --op allreduce
# --world 2 with it, the peers and NCCL. Prediction: the TP2 rows of 2026-11-23 kept up to 16 MB; 128 programs
# at 64 MB by about 1%; ours at or below the faster peer at every size (as on 2026-11-23).
source scripts/gpu_env.sh; export CUDA_VISIBLE_DEVICES=0,1; cp tritoncomm/collectives/tables/nvidia-h200.json $OUT/nvidia-h200-tp2.json; timeout 250 python3 -m tritoncomm tune --op allreduce --world 2 --out $OUT/nvidia-h200-tp2.json > $OUT/tune-tp2.log 2>&1; echo "tune rc $?"; grep -E "^ +allreduce" $OUT/tune-tp2.log; timeout 200 python3 -m tritoncomm bench --op allreduce --world 2 --modes graph --table $OUT/nvidia-h200-tp2.json --json $OUT/bench-tp2.json > $OUT/bench-tp2.log 2>&1; echo "bench rc $?"; grep -v Warning $OUT/bench-tp2.log | grep -v enable_symm | tail -24
