#!/usr/bin/env bash
# Correctness on one GPU (ranks sharing it; never speed), in one device call: the launcher's check at world 1
# (every launch takes Triton's C entry), then the GPU tests at world 2 in two streams side by side (the
# all-reduce family; everything else), then the main job's checks (odd shapes, graphs with fresh data,
# stragglers) with ranks sharing the GPU. With TRITON=3.8 (say) the Triton unpacked into /tmp/triton-3.8.0
# (../shared/tools/triton_to_device.sh) comes first on the path. Logs under $OUT; a table last.
# Usage: TRITON=3.8 [K=pytest -k expression] bash scripts/gpu_shared_all.sh [PART ...]
# Parts (default: all but files): launcher, allreduce, rest (two streams), demo, files (pytest arguments in $FILES,
# with $FILES2 as a second stream beside it); the streams run side by side.
set -uo pipefail
if [ -n "${TRITON:-}" ]; then
  dir=$(ls -d /tmp/triton-"$TRITON"* 2>/dev/null | head -1)
  [ -n "$dir" ] || { echo "gpu_shared_all.sh: no /tmp/triton-$TRITON*: unpack its chunks first"; exit 1; }
  export PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH}
fi
source "$(dirname "$0")/gpu_env.sh"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee "$OUT/versions"
parts=" ${*:-launcher allreduce rest demo} "
kx=(); [ -n "${K:-}" ] && kx=(-k "$K")
export TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_SHARED_GPUS=1
pytest_() {  # name, worlds, limit, pytest arguments
  local name=$1 worlds=$2 limit=$3; shift 3
  TRITONCOMM_TEST_WORLDS=$worlds timeout "$limit" python3 -m pytest -v -p no:cacheprovider -rfE --maxfail=8 \
    "${kx[@]}" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc $? $(grep -c " PASSED" "$OUT/$name.log") passed; $(tail -1 "$OUT/$name.log" | cut -c1-120)" >> "$OUT/summary"
}
: > "$OUT/summary"
has() { [[ $parts == *" $1 "* ]]; }
has launcher && pytest_ launcher-w1 1 100 tests/kernels/test_launcher.py
has rest && pytest_ heap-w2 2 100 tests/channels/test_heap.py  # reads the device's free memory: alone on the GPU
has allreduce && pytest_ allreduce-w2 2 "${LIMIT:-330}" tests/collectives/test_allreduce.py tests/kernels/test_lamport.py &
has rest && pytest_ collectives-w2 2 "${LIMIT:-330}" tests/collectives --ignore=tests/collectives/test_allreduce.py &
has rest && pytest_ others-w2 2 "${LIMIT:-330}" tests --ignore=tests/collectives --ignore=tests/channels/test_heap.py \
  --ignore=tests/kernels/test_lamport.py \
  --ignore=tests/kernels/test_launcher.py --ignore=tests/kernels/test_ptx.py &
has files && pytest_ files-w2 2 "${LIMIT:-330}" $FILES &
has files && [ -n "${FILES2:-}" ] && pytest_ files2-w2 2 "${LIMIT:-330}" $FILES2 &
wait
if has demo; then
  timeout 120 python3 -m tritoncomm demo --world 2 --shared-gpus --json "$OUT/demo.json" > "$OUT/demo.log" 2>&1
  echo "demo: rc $? $(grep -m1 -i 'checks passed\|failed' "$OUT/demo.log")" >> "$OUT/summary"
fi
grep -h " FAILED\|^FAILED\|^ERROR" "$OUT"/*.log | cut -c1-200 | head -20
cat "$OUT/versions" "$OUT/summary"
