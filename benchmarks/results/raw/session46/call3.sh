#!/usr/bin/env bash
# Session 46, call 3 (2 GPUs, warm after call 2): the EP2 bench with its default counts, run as its command line
# was given to the device (no script file was written before the call; no prediction was written: the H200s came
# unasked for and the bench ran while they were held).
PHASES=bench BENCH_TIMEOUT=540 bash scripts/gpu_moe.sh 2>&1 | grep -E " both |MoE|NO|H200|H100|torch"
OUT=${OUT:-gpu-out}; ls $OUT
