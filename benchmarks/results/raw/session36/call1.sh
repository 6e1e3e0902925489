#!/usr/bin/env bash
# Session 36, call 1 (2 GPUs). (1) Bounded calls on instances sized for 4096 tokens: routing copies
# sized by the bound (bounded_copies=1) against the instance's width, with the decode shape
# (default below 16 tokens) and with decode_below=33 (the decode shape at 16 and 32 tokens too).
# (2) Decode-sized instances (max_tokens = tokens) at 32 / 64 / 96 tokens: the decode shape (the
# default below PREFILL_FROM = 128) against the prefill shape. Dispatch + combine in graphs.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
PF="programs=264+block_h=2048+num_warps=8+send_block_h=4096+one_block_h=2048"
for shape in deepseek-v3 qwen3-moe; do
  timeout 200 $M --shape $shape --tokens 1,8,16,32 --max-tokens 4096 --heap-gb 8 --json "$OUT/b-$shape.json" \
    --variants bound,bound+bounded_copies=1,bound+decode_below=33,bound+decode_below=33+bounded_copies=1 2>&1 \
    | tail -5 | sed "s/^/$shape bound: /"
  timeout 120 $M --shape $shape --tokens 32,64,96 --json "$OUT/p-$shape.json" --variants default,$PF 2>&1 \
    | tail -4 | sed "s/^/$shape small: /"
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for t, vs in d["times_us"].items():
        row = " ".join(f"{k.replace('programs=264+block_h=2048+num_warps=8+send_block_h=4096+one_block_h=2048', 'PF').replace('bounded_copies=1', 'bc').replace('decode_below=', 'db')}:{statistics.median(x):.2f}"
                       for k, x in vs.items() if x)
        print(f"{d['shape']:12s} m={d['max_tokens']} {t:>4s} {row}")
PY
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
