#!/usr/bin/env bash
# For a later call (written in session 55, not run: no device minutes were left), on nvidia-h200-x2.
# tc.AllToAll (equal shards; staged: the all-gather's push kernel with a shard per peer, barrier, copy out; direct:
# stores into a registered output between two barriers) and the torch backend serving all_to_all_single.
# 1. GPU tests: the collective against NCCL's all_to_all_single (fallback included), direct vs staged bits, the
#    backend's served and delegated ops.
# 2. bench --op alltoall at TP2, 4 KB - 64 MB, NCCL timed in the same run (graphs).
# Prediction: below 256 KB about 4-6 µs against NCCL's ~12-20 µs (one push, one barrier, one copy, as our
# all-gather); at 64 MB within 15% of NCCL (link-bound, each rank sends half its input). The direct form a little
# slower below 1 MB (two barriers), faster from a few MB (no copy out), as the all-gather's.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_allreduce.py tests/channels/test_registered.py tests/integrations/test_backend.py \
  -k "alltoall or served or delegated" 2>&1 | tail -3
timeout 300 python3 -m tritoncomm bench --op alltoall --world 2 --json "$OUT/alltoall-h200-tp2.json" 2>&1 | tail -22
