#!/usr/bin/env bash
# The main job: set up, then launch local ranks (GPUs when present, else the CPU world) and print
# the all-reduce correctness and timing table. Extra arguments go to `python -m tritoncomm demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash scripts/setup.sh
source scripts/python.sh
exec "$PY" -m tritoncomm demo "$@"
