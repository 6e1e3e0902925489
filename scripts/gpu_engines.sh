#!/usr/bin/env bash
# On a GPU machine: vLLM's and SGLang's own code driving tritoncomm on GPUs
# (tests/integrations/test_engines_gpu.py). The engines' code comes in the pack that
# scripts/engines_gpu_pack.sh writes (carry ".engines"); it is unpacked under /tmp. On one GPU,
# SHARED=1 runs both ranks on it (no NCCL there: correctness only). Logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
pack=$(ls .engines/engines-py*.tar.xz 2>/dev/null | head -1)
[ -n "$pack" ] || { echo "gpu_engines.sh: no pack in .engines (run scripts/engines_gpu_pack.sh and carry .engines)"; exit 1; }
# the engines find plugins by their entry points: tritoncomm's metadata goes beside the checkout,
# whose code comes first on the path
python3 -m pip install -q --upgrade --no-deps --no-index --no-build-isolation --target /tmp/tritoncomm-meta . \
  || { echo "gpu_engines.sh: could not build tritoncomm's metadata"; exit 1; }
export PYTHONPATH=$PYTHONPATH:/tmp/tritoncomm-meta
export TRITONCOMM_ENGINES_CACHE=/tmp/tritoncomm-engines
mkdir -p "$TRITONCOMM_ENGINES_CACHE" && tar -xJf "$pack" -C "$TRITONCOMM_ENGINES_CACHE"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_SHARED_GPUS=${SHARED:-0} timeout ${TEST_TIMEOUT:-400} \
  python3 -m pytest -q -p no:cacheprovider -rfEs tests/integrations/test_engines_gpu.py "$@" 2>&1 \
  | tee "$OUT/gpu-engines.log" | tail -${TAIL:-40}
