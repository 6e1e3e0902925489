#!/usr/bin/env bash
# Session 50, call 4 (2 GPUs): the slow replays and the barrier's pollers. docs/algorithms.md ("Barrier grids"): the
# all-reduce's barrier kernels stalled 17-30x in rare timings past 512 warps (128 programs x 8 warps at TP4), and
# tuning caps them at 64 programs and 512 warps; the MoE kernels run 264 programs x 8 warps (2112 warps) through
# barriers, and (c), which keeps the caps, never stalled. Hypothesis: many warps polling the barrier flags (acquire
# loads at system scope, every warp of a program; 32 bytes of flags per slot, so a few L2 lines) and each releasing
# (a system-scope release per warp) delay the peers' flag stores for milliseconds. Test at EP2, where stalls are
# rare: (1) more pollers (programs=528: 4224 warps) should make them common; (2) TRITONCOMM_FIRST_WARP=both (each
# program's first warp alone polls and releases the barrier's flags, the others wait at the CTA barrier; an
# experiment switch in kernels/barrier.py) should remove them and cost nothing.
# Prediction: (1) ours+programs=528 slow in >= 5 of 80 samples, ours in <= 2, tc 0; (2) with the switch 0 slow in
# every case, medians within 1% of (1)'s. Then the GPU tests of the MoE routed paths and the all-reduce with the switch.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
S="benchmarks/experiments/moe_stalls.py --world 2 --shape qwen3-moe --tokens 384 --rounds 4 --cases ours,ours+programs=528,tc"
timeout 170 python3 $S --json "$OUT/stalls.json" > "$OUT/stalls.log" 2>&1
TRITONCOMM_FIRST_WARP=both timeout 170 python3 $S --json "$OUT/stalls-first-warp.json" > "$OUT/stalls-first-warp.log" 2>&1
TRITONCOMM_FIRST_WARP=both TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q \
  -p no:cacheprovider tests/collectives/test_moe.py tests/collectives/test_allreduce.py -k "two_kernel or routed or twoshot or oneshot" \
  2>&1 | tail -3
echo "== default"; tail -6 "$OUT/stalls.log"; echo "== TRITONCOMM_FIRST_WARP=both"; tail -6 "$OUT/stalls-first-warp.log"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
