#!/usr/bin/env bash
# Session 36, call 2 (2 GPUs): the new defaults (bounded_copies on with at least one entry per thread;
# PREFILL_FROM 64; decode_below = prefill_from; the decode shape on one-kernel instances too). The MoE
# and EP GPU tests; bounded calls on 4096-token instances at 1-64 tokens against copies of the
# instance's width (bounded_copies=0) and against the prefill shape (decode_below=1); instances sized
# for 48 / 64 / 96 tokens with each shape. Dispatch + combine in graphs.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 220 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
M="python3 benchmarks/experiments/moe_variants.py --world 2"
PF="programs=264+block_h=2048+num_warps=8+send_block_h=4096+one_block_h=2048"
DEC="programs=132+block_h=1024+num_warps=4+send_block_h=0+one_block_h=0"
for shape in deepseek-v3 qwen3-moe; do
  timeout 150 $M --shape $shape --tokens 1,8,16,32,48,64 --max-tokens 4096 --heap-gb 8 --json "$OUT/b-$shape.json" \
    --variants bound,bound+bounded_copies=0,bound+decode_below=1 2>&1 | tail -7 | sed "s/^/$shape bound: /"
  timeout 90 $M --shape $shape --tokens 48,64,96 --json "$OUT/p-$shape.json" --variants $DEC,$PF 2>&1 \
    | tail -4 | sed "s/^/$shape small: /"
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
names = {"programs=264+block_h=2048+num_warps=8+send_block_h=4096+one_block_h=2048": "PF",
         "programs=132+block_h=1024+num_warps=4+send_block_h=0+one_block_h=0": "DEC"}
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for t, vs in d["times_us"].items():
        row = " ".join(f"{names.get(k, k)}:{statistics.median(x):.2f}" for k, x in vs.items() if x)
        print(f"{d['shape']:12s} m={d['max_tokens']} {t:>4s} {row}")
PY
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
