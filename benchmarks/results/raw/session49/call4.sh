#!/usr/bin/env bash
# Session 49, call 4 (4 GPUs asked for): the slow graph replays. In calls 1 and 3 (and session 48's EP4 calls) 5-45%
# of the samples of the routed sizes at EP4 (256-512 tokens) took 2.4-5.2 ms per call (a replay of 32 calls stalled
# by some 80-160 ms), against none of 1,200 samples at 1, 8 and 128 tokens (one kernel, packets). moe_stalls.py
# times ours (default, without PDL, with the route kernel's own barrier, at 128 tokens), (c) and (b) in turn, with
# every rank's host clocks per sample.
# Prediction: the stalls come with the routed path only (none for 128 tokens, tc or nccl), and the ranks' hosts
# keep step in them (spread under 1 ms): a GPU-side cause, not the harness.
set -uo pipefail
source scripts/gpu_env.sh
S=benchmarks/experiments/moe_stalls.py
C="ours,ours+no-pdl,ours+route_barrier=1,ours@128,tc,nccl"
timeout 200 python3 $S --world 4 --shape qwen3-moe --tokens 384 --cases $C --json "$OUT/ep4-q384.json" 2>&1 | tail -8
timeout 200 python3 $S --world 4 --shape deepseek-v3 --tokens 512 --cases $C --json "$OUT/ep4-ds512.json" 2>&1 | tail -8
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
