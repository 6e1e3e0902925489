#!/usr/bin/env bash
# For a later call (written in session 54, not run: nvidia-h200-x8 was never lent), on nvidia-h200-x8: the MoE
# issue's EP8 figures. (1) The MoE GPU tests at world 8 (dispatch/combine against the torch reference, graph
# replay with new routing, stragglers), 200 s; (2) bench --op moe --world 8 at 1, 128 and 4096 tokens per rank
# (the published bars: pplx-kernels 84 + 102 µs at 128 tokens, Triton-distributed about 76 + 126 on 8x H800;
# DeepEP 153-158 GB/s at 4096 with FP8 dispatch). A fresh machine has an empty Triton cache: at EP4 three large
# counts did not finish in 300 s cold, so the bench's counts are few; its stderr names each count as it ends.
# Prediction: tests pass; at 128 tokens both phases below 60 µs (DeepSeek-V3); at 4096 the dispatch above
# 160 GB/s per rank (bf16).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=8 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -x 2>&1 | tail -6
timeout 330 python3 -m tritoncomm bench --op moe --world 8 --tokens 1,128,4096 --json "$OUT/moe-ep8.json" \
  > "$OUT/moe-ep8.log" 2>&1; echo "bench rc $?"
grep -E "both|bench --op moe" "$OUT/moe-ep8.log" | head -30
