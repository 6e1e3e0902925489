#!/usr/bin/env bash
# Session 54 call 2 (nvidia-h200-x2, warm after call 1): call 1's DeepSeek-V3 run ran out of its 8 GB heap
# (five variants' instances at 4096 tokens); again with 16 GB and four variants.
source scripts/gpu_env.sh; timeout 250 python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 16 --rounds 2 --shape deepseek-v3 --tokens 1024,2048,4096 --variants default,own_late_pct=25,own_late_pct=50,programs=256 --json $OUT/own-late-deepseek-v3.json > $OUT/own-late-deepseek-v3.log 2>&1; echo rc $?; tail -5 $OUT/own-late-deepseek-v3.log
