#!/usr/bin/env bash
# For a later call (written in session 55, not run: no device minutes were left), on nvidia-h200-x2.
# MoEShape.combine_chunks (off by default; CPU-world tests, PTX checks): the throughput combine without its
# barrier. Each program pushes its partials in N chunks, publishes each chunk at a slot of its own, and sums its own
# tokens of the chunk before once the peers published it, its own part computed from the expert buffer in registers:
# the plain mode stores that part into `out` before its barrier and reads it back (2 x 59 MB at DeepSeek-V3 4096
# tokens, EP2, of the combine's ~765 MB). own_late_pct (session 54) moved that work after the barrier and lost
# (+3.7 µs at 25%); here it stays beside the pushes but for the last chunk's, with one release per chunk.
# 1. GPU tests: the chunked path in the graph-replay and straggler tests (routed-chunked), the CPU-shape tests.
# 2. Both phases in turn with the default, 2 rounds, DeepSeek-V3 and Qwen3-MoE at 1024-4096 tokens per rank.
# Prediction: DeepSeek-V3 at 4096 about 10 µs less with 4 chunks (480 -> ~470; the bytes saved, less the last
# chunk's sums after the pushes), 8 chunks within 5 µs of 4 (more releases, each waiting for the program's pushes
# in flight); Qwen3-MoE about 60% of that; 1024 level. If it loses everywhere, the releases cost more than the bytes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "routed-chunked or chunked_throughput" 2>&1 | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for s in deepseek-v3 qwen3-moe; do
  timeout 200 $M --shape $s --tokens 1024,2048,4096 \
    --variants default,combine_chunks=2,combine_chunks=4,combine_chunks=8 --json "$OUT/chunks-$s.json" \
    > "$OUT/chunks-$s.log" 2>&1; echo "$s rc $?"; tail -4 "$OUT/chunks-$s.log"
done
