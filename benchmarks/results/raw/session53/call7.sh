#!/usr/bin/env bash
# Session 53, call 7 (nvidia-h200-x2): moe_variants and moe_trace now build the library's default shape with the
# device's name (the send interleave on for DeepSeek-V3 bf16 from 2048 tokens at EP2). (1) moe_variants, DS 4096,
# dispatch alone: default against interleave_from=NEVER (1 << 62). (2) Stage stamps of the dispatch with the
# interleaved send kernel (never taken: session 52's and call 6's were without it), DS 4096.
# Prediction: (1) default about 13 µs less (session 52: 243.5 -> 230.8); (2) rows sent later than call 6's 170
# (median), laid out about 15 µs earlier than its 233.8.
set -uo pipefail
source scripts/gpu_env.sh
timeout 80 python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --op dispatch \
  --shape deepseek-v3 --tokens 4096 --variants default,interleave_from=4611686018427387904 \
  > "$OUT/variants.log" 2>&1; echo "variants rc $?"; tail -2 "$OUT/variants.log"
timeout 80 python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 4096 --heap-gb 8 --shape deepseek-v3 \
  > "$OUT/trace-ds.log" 2>&1; echo "trace rc $?"; grep -A 17 "rank 0" "$OUT/trace-ds.log" | head -18
