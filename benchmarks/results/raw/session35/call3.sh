#!/usr/bin/env bash
# Session 35, call 3 (2 GPUs), tree 28e52bd: where the half/half role split (send_programs and
# push_programs each half the programs) stops paying. The decode shape (132 programs) at 16 / 32 /
# 64 tokens, each half alone too; and calls with tokens_bound on instances sized for 4096 tokens
# (the prefill shape, 264 programs) at 1 / 8 / 64 / 128 tokens. Dispatch + combine, graphs.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for shape in deepseek-v3 qwen3-moe; do
  timeout 100 $M --shape $shape --tokens 16,32,64 --json "$OUT/d-$shape.json" \
    --variants default,send_programs=66+push_programs=66,send_programs=66,push_programs=66 2>&1 | tail -4 \
    | sed "s/^/$shape decode: /"
  timeout 120 $M --shape $shape --tokens 1,8,64,128 --max-tokens 4096 --json "$OUT/b-$shape.json" \
    --variants bound,bound+send_programs=132+push_programs=132 2>&1 | tail -5 | sed "s/^/$shape bound: /"
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for t, vs in d["times_us"].items():
        row = " ".join(f"{k.replace('send_programs=', 's').replace('push_programs=', 'p')}:{statistics.median(x):.2f}"
                       for k, x in vs.items())
        print(f"{d['shape']:12s} m={d['max_tokens']} {t:>4s} {row}")
PY
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
