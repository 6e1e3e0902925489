#!/usr/bin/env bash
# Session 35, call 2 (2 GPUs), tree 28e52bd: how many of the one-kernel dispatch's programs send
# (send_programs, s) and how many of the latency combine's push (push_programs, p), dispatch +
# combine in graphs, both shapes: 132 programs at 1 / 8 / 64 tokens, 264 at 128 (the prefill shape
# starts at 128 tokens).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
v() { local out=default; for sp in "$@"; do out+=",send_programs=${sp%/*}+push_programs=${sp#*/}"; done; echo $out; }
V132=$(v 66/66 44/66 88/66 33/66 99/66 66/44 66/88 66/33 66/99)
V264=$(v 132/132 88/132 176/132 66/132 132/88 132/176 176/176)
for shape in deepseek-v3 qwen3-moe; do
  timeout 140 $M --shape $shape --tokens 1,8,64 --variants $V132 --json "$OUT/s132-$shape.json" 2>&1 | tail -5 \
    | sed "s/^/$shape 132: /"
  timeout 90 $M --shape $shape --tokens 128 --variants $V264 --json "$OUT/s264-$shape.json" 2>&1 | tail -3 \
    | sed "s/^/$shape 264: /"
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/s*.json")):
    d = json.load(open(f))
    for t, vs in d["times_us"].items():
        row = " ".join(f"{k.replace('send_programs=', 's').replace('+push_programs=', '/')}:{statistics.median(x):.2f}"
                       for k, x in vs.items())
        print(f"{d['shape']:12s} {t:>4s} {row}")
PY
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
