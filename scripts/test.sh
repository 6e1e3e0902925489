#!/usr/bin/env bash
# The tests: set up, lint, run the suite (the CPU world unless TRITONCOMM_TEST_BACKEND=cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash scripts/setup.sh
PY=${PYTHON:-python3}
# vLLM's and SGLang's own code for the engine tests (fetched once, cached; tests/integrations/engines.py)
"$PY" -m tests.integrations.engines >/dev/null
"$PY" -m ruff check .
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
