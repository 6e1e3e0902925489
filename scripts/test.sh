#!/usr/bin/env bash
# The tests: set up, lint, the compile checks on the other supported Tritons (without arguments), then the suite
# (the CPU world unless TRITONCOMM_TEST_BACKEND=cuda). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash scripts/setup.sh
source scripts/python.sh
"$PY" -c 'import torch, triton, numpy; print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)'
# vLLM's and SGLang's own code for the engine tests (fetched once, cached; tests/integrations/engines.py)
"$PY" -m tests.integrations.engines >/dev/null
"$PY" -m ruff check .
[ $# -gt 0 ] || bash scripts/ptx_tritons.sh
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
