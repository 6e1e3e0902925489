#!/usr/bin/env bash
# Install what the main job and the tests need into $PY (scripts/python.sh): torch, Triton, this package with its
# dev extras. A torch and a Triton already there are kept when recent enough (torch 2.11+, Triton 3.6+):
# beside an engine, its own. Otherwise TORCH (default 2.14.1, the engines' stack) comes as its CPU wheel where one is
# configured or PyTorch's CPU index answers, else as the package index's CUDA build (several GB), and a CPU torch
# gets TRITON (default 3.8.0, the release torch 2.14 requires). Triton 3.6's interpreter needs numpy<2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
TORCH=${TORCH:-2.14.1}
TRITON=${TRITON:-3.8.0}
pipi() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
NEED_GB=${NEED_GB:-8}  # a CUDA build of torch: about 5.5 GB installed, plus pip's unpacked copy while it installs
need_disk() {  # exit 1, saying where, when a folder's file system has less than NEED_GB free
  local dir free
  for dir in "$@"; do
    free=$(df -Pk "$dir" | awk 'NR == 2 {print int($4 / 1048576)}')
    if [ "$free" -lt "$NEED_GB" ]; then
      echo "setup.sh: $dir has $free GB free; torch's CUDA build needs about $NEED_GB GB there. Free space, or" \
        "set PYTHON to a Python with torch 2.11+ and Triton 3.6+ already installed" >&2
      exit 1
    fi
  done
}
supported() {  # exit 0 when the torch and Triton in $PY are recent enough (a newer Triton launches through its own path)
  "$PY" - <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
rel = lambda v: tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in v.split("+")[0].split(".")[:2])
sys.exit(0 if rel(version("torch")) >= (2, 11) and rel(version("triton")) >= (3, 6) else 1)
PYEOF
}
if ! "$PY" -c "import torch" 2>/dev/null; then
  if pipi "torch==$TORCH+cpu" 2>/dev/null; then
    :
  elif pipi --retries 1 --timeout 20 "torch==$TORCH+cpu" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple 2>/dev/null; then
    :
  else
    echo "setup.sh: no CPU wheel of torch $TORCH here or on PyTorch's CPU index; installing the package index's" \
      "torch $TORCH (CUDA build, several GB)" >&2
    need_disk "$("$PY" -c 'import sys; print(sys.prefix)')" "${TMPDIR:-/tmp}"
    pipi "torch==$TORCH"
  fi
fi
"$PY" -c "import triton" 2>/dev/null || pipi "triton==$TRITON"  # a CPU torch brings none
if ! supported; then
  echo "setup.sh: tritoncomm needs torch 2.11 or later and Triton 3.6 or later; this Python has" \
    "$("$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')" >&2
  exit 1
fi
pipi -e ".[dev]"
problem=$("$PY" -c "from tritoncomm.kernels.interpreter import numpy_problem; print(numpy_problem() or '')")
if [ -n "$problem" ]; then
  echo "setup.sh: $problem: installing numpy<2.4" >&2
  pipi "numpy<2.4"
fi
