#!/usr/bin/env bash
# On a GPU machine (the image's python3, no installs): GPU tests, then the demo at world 2 and at
# every GPU. Logs and JSON go to $OUT (default: ./gpu-out). Usage: bash scripts/gpu_check.sh [pytest -k expr]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
rc=0
TRITONCOMM_TEST_BACKEND=cuda timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider \
  ${1:+-k "$1"} 2>&1 | tee "$OUT/gpu-tests.log" | tail -25 || rc=1
for w in $WORLDS; do
  timeout 240 python3 -m tritoncomm demo --world "$w" --json "$OUT/demo-tp$w.json" 2>&1 | tee "$OUT/demo-tp$w.log" || rc=1
done
exit $rc
