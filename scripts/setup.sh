#!/usr/bin/env bash
# Install what the CPU world needs on a fresh machine (torch's CPU wheel, triton, the package).
# torch comes as its CPU wheel: from the wheels pip is configured with, else PyTorch's CPU index. PyPI's torch
# 2.13.0 is the CUDA build and asks for triton 3.7, which the package's triton pin (3.6.0) refuses, so pip would
# fall back to an older CUDA torch with several GB of CUDA packages; that is the last resort, said aloud.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=2.13.0
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH') else 1)" 2>/dev/null; then
  if "$PY" -m pip install -q "torch==$TORCH+cpu" 2>/dev/null; then
    :
  elif "$PY" -m pip install -q "torch==$TORCH+cpu" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple; then
    :
  else
    echo "setup.sh: no CPU wheel of torch $TORCH (configured wheels or download.pytorch.org); installing" \
      "the newest torch that works with triton 3.6.0 from the package index (CUDA packages, several GB)" >&2
    "$PY" -m pip install -q "torch>=2.4" "triton==3.6.0"
  fi
fi
"$PY" -m pip install -q -e ".[dev]"
