#!/usr/bin/env bash
# Pack the engines' code (vLLM, SGLang and what their imports need) for the GPU image's Python, which
# cannot fetch it: run the CPU-world engine tests with an import trace, then tests/integrations/gpupack.py.
# Writes .engines/engines-py${TARGET:-3.12}.tar.xz (git-ignored): carry ".engines" in a device call, unpack
# it there and point TRITONCOMM_ENGINES_CACHE at it (scripts/gpu_engines.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
trace=$(mktemp -d)
TRITONCOMM_TRACE_IMPORTS=$trace PYTHONPATH=tests/integrations/trace${PYTHONPATH:+:$PYTHONPATH} \
  "$PY" -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py tests/integrations/test_vllm_moe.py \
  tests/integrations/test_sglang.py
"$PY" -m tests.integrations.gpupack "$trace" ".engines/engines-py${TARGET:-3.12}.tar.xz" --python "${TARGET:-3.12}"
rm -rf "$trace"
