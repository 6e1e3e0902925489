#!/usr/bin/env bash
# The compile checks (tests/kernels/test_ptx.py, the launch-entry tests) on other Triton releases than the installed
# one: each from the package index into .tritons/<version> (no dependencies, about 250 MB), then put ahead of the
# installed one on the path. Usage: bash scripts/ptx_tritons.sh [VERSION ...] (default: 3.6.0 3.7.1 3.9.0).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
here=$("$PY" -c "import triton; print(triton.__version__)")
rc=0
versions=${*:-3.6.0 3.7.1 3.9.0}
for v in $versions; do
  [ "$v" = "$here" ] && continue
  if [ ! -f ".tritons/$v/triton/__init__.py" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target ".tritons/$v" "triton==$v"
  fi
  got=$(PYTHONPATH=".tritons/$v" "$PY" -c "import triton; print(triton.__version__)")
  [ "$got" = "$v" ] || { echo "ptx_tritons.sh: .tritons/$v imports triton $got" >&2; exit 1; }
  echo "== compile checks on triton $v"
  PYTHONPATH=".tritons/$v" "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_ptx.py \
    tests/kernels/test_launcher.py -k "not matches_triton" | tail -n 3 || rc=1  # that one runs ranks: the suite's
done
exit $rc
