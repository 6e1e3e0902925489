#!/usr/bin/env bash
# Session 36, call 4 (2 GPUs), tree of call 3: the prefill shape's knobs at 512 tokens per rank
# (where our all-gather + reduce-scatter beats us) and 4096 (DeepSeek-V3): columns per send step
# (send_block_h), per layout / combine step (block_h), programs per SM (1, 2 = default, 3).
# Dispatch + combine in graphs, 3 rounds each.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,send_block_h=2048,send_block_h=8192,block_h=1024,block_h=4096,programs=132,programs=396
for shape in deepseek-v3 qwen3-moe; do
  timeout 150 $M --shape $shape --tokens 512 --variants $V --json "$OUT/k512-$shape.json" 2>&1 | tail -2 \
    | sed "s/^/$shape: /"
done
timeout 200 $M --tokens 4096 --heap-gb 12 --variants default,send_block_h=8192,block_h=4096,programs=396 \
  --json "$OUT/k4096-ds.json" 2>&1 | tail -2 | sed "s/^/ds 4096: /"
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for t, vs in d["times_us"].items():
        print(f"{d['shape']:12s} {t:>5s} " + " ".join(f"{k}:{statistics.median(x):.1f}" for k, x in vs.items() if x))
PY
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
