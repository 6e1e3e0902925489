# Sourced by setup.sh, main.sh and test.sh: $PY, the Python that tritoncomm is installed into and run with.
# PYTHON when set; else the active virtual environment's python3; else ./.venv (made here on the first run),
# since a distribution's own Python refuses pip installs (PEP 668).
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
  PY=python3
else
  if [ ! -x .venv/bin/python ]; then
    echo "tritoncomm: making a virtual environment in .venv (set PYTHON=... to use another Python)" >&2
    python3 -m venv .venv || { echo "tritoncomm: 'python3 -m venv' failed: install your distribution's venv" \
      "package (python3-venv), or set PYTHON to a Python that pip may install into" >&2; exit 1; }
  fi
  PY=$PWD/.venv/bin/python
fi
export PY
