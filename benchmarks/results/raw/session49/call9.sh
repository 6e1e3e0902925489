#!/usr/bin/env bash
# Session 49, call 9 (4 GPUs asked for; lent again after call 8), on main with the host copy of the dispatch's
# counters made only where they changed: the stalls against the dispatch's write into host memory. Every dispatch's
# program 0 stored the two counters (bad ids, drops) into host-mapped words; (c) writes no host memory and never
# stalled; the GPUs are virtual-machine passthrough devices (bus 00:06.0-00:09.0), whose writes to host memory cross
# the hypervisor's IOMMU. Call 7: no clock event; call 8: no stall at EP1 (0 of 480, either tree). EP4, Qwen3-MoE,
# 384 tokens, ours and (c), 6 rounds; then the GPU tests of the counters (bad ids reported, drops) at world 4.
# Prediction: if the host writes cause them, no stall in 120 samples (the default had 14 of 120 in call 7); else
# about as many as before.
set -uo pipefail
source scripts/gpu_env.sh
timeout 200 python3 benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe --tokens 384 --rounds 6 \
  --cases ours,tc --json "$OUT/hostcopy.json" 2>&1 | tail -2
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "bad or hot or dropped" 2>&1 | tail -2
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
