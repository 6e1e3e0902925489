#!/usr/bin/env bash
# Session 45, call 5 (2 GPUs): where the combine's switch now lies at EP2, on the tree with the latency combine's
# sums reversed: each mode forced, both phases, in turn, 2 rounds. DeepSeek-V3 at 320-640 tokens per rank (2.2-4.4
# Mi elements of partials received per rank), Qwen3-MoE at 576-1024 (2.3-4 Mi).
# Prediction (written before the call): the latency mode wins up to DeepSeek-V3's 448 and Qwen3-MoE's 640 and loses
# from 512 and 768.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants mode=latency,mode=throughput"
timeout 150 $M --shape deepseek-v3 --tokens 320,384,448,512,640 --json "$OUT/ds.json" 2>&1 | tail -6 | sed "s/^/ds: /"
timeout 150 $M --shape qwen3-moe --tokens 576,640,704,768,1024 --json "$OUT/q.json" 2>&1 | tail -6 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
