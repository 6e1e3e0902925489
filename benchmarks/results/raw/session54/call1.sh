#!/usr/bin/env bash
# Session 54 call 1 (nvidia-h200-x2), the ready script raw/session53/next-own-late.sh as written:
# MoEShape.own_late_pct (off by default; CPU-world tests only): the throughput combine sums the own part of the
# last N percent of each program's own items after its barrier, from the expert buffer, instead of storing it into
# `out` before the barrier and reading it back. At EP2 the combine is bound by HBM (stage stamps, session 53 call 6:
# its push phase moves about 590 MB in 187 µs while 59 MB cross the link, its final sums 177 MB in 51 µs), so the
# bytes saved (2 x 59 MB x N%) should pay while the push phase stays above the link's time (about 163 µs).
# Its GPU test at world 2, then both phases in turn with the default, 2 rounds, DeepSeek-V3 and Qwen3-MoE at
# 1024-4096 tokens per rank.
# Also programs=256 (against 264 on an H200): the rows and items are dealt over the programs, and 4096 tokens over
# 264 programs give 136 of them 16 rows and the rest 15; the interleaved send's stage stamps (call 7) had the
# latest program's rows sent 20 µs after the median's, about one row's time (11 µs) and more. 256 deals 16 to each.
# Prediction (arithmetic at 3.2 TB/s): DeepSeek-V3 at 4096 about 10 µs less with 25, level or less with 50, more
# with 100; Qwen3-MoE about half of that; 1024 level or more (the push phase nearer the link's time);
# programs=256 3-8 µs less at 2048-4096 (even deals), level at 1024.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 80 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "own_part_summed_late" 2>&1 | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  timeout 200 $M --shape $s --tokens 1024,2048,4096 \
    --variants default,own_late_pct=25,own_late_pct=50,own_late_pct=100,programs=256 --json "$OUT/own-late-$s.json" \
    > "$OUT/own-late-$s.log" 2>&1; echo "$s rc $?"; tail -4 "$OUT/own-late-$s.log"
done
