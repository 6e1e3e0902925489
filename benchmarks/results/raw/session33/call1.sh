#!/usr/bin/env bash
# Session 33, call 1 (2 GPUs): the shared routing copy against a copy per program (moe_variants), a
# kernel profile at 128 tokens, then the MoE GPU tests and bench --op moe.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m | head -3
V="timeout 100 python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default,shared_copy=0"
$V --op dispatch --json "$OUT/var-dispatch-ds.json" 2>&1 | tail -6 | tee "$OUT/var-dispatch-ds.log"
$V --json "$OUT/var-both-ds.json" 2>&1 | tail -6 | tee "$OUT/var-both-ds.log"
PHASES="tests bench" TEST_TIMEOUT=200 BENCH_TIMEOUT=240 bash scripts/gpu_moe.sh
$V --shape qwen3-moe --json "$OUT/var-both-qwen.json" 2>&1 | tail -6 | tee "$OUT/var-both-qwen.log"
timeout 60 python3 benchmarks/experiments/moe_profile.py --world 2 --tokens 128 2>&1 | tail -12 | tee "$OUT/profile-128.log"
